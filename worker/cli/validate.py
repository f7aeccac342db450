"""``inturn validate FILE...``: check Destination manifests, feeds files and ingest channel
declarations offline, without a database or a cluster, and report every problem.

What a file may hold (YAML, several documents separated by ``---``, or JSON):

* a ``Destination`` (or a ``List``/``DestinationList`` of them): checked as the API server
  checks it with the CRD (schema, defaults, CEL rules by their Python twins, unknown fields
  refused as ``kubectl apply --validate=strict`` does) plus what the operator checks (the time
  zone of ``spec.schedule``);
* a ``WorkerConfig`` (the operator's rendered ``worker.json``; ``kind`` may be left out);
* a feeds file (``feeds: [...]``, ``inturn ingest --feeds``);
* ingest channel declarations (``channels: [...]``, the shape of the chart's
  ``ingest.channels``: name, port, allowedNetworks, allowedSubjects, unrouted);
* a Helm values file of the chart (``ingest:`` with ``channels`` and ``feeds``; only these two
  are read).

Across every document given: a Destination (``namespace/name``) or a channel declared twice,
and a carrier served by two Destinations, are errors. When channels are declared, a
Destination or feed whose channel none declares is a warning (its messages may still arrive
over HTTP ingest, which takes any channel).

Output: one line per problem on stdout, ``FILE#N: field.path: what is wrong`` (N counts the
file's documents from 1), warnings as ``warning: ...``, then a summary line. Exit status: 0 when
every document is valid (warnings do not count), 1 when any problem was found, 2 for a usage
error (no FILE, a FILE that does not exist or cannot be read).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import yaml

from inturn.worker.feeds.declare import feed_problems
from inturn.worker.spec import channels as channel_decls
from inturn.worker.spec import schema
from inturn.worker.spec.destination import (
    ManifestError,
    destination_key,
    load_worker_config,
    validate_manifest,
)

#: Exit statuses.
EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


@dataclass
class Report:
    """What a check found.

    Attributes:
        errors: ``source: path: problem`` lines, in the order found.
        warnings: lines that do not make the documents invalid.
        documents: how many documents were read.
        destinations: ``namespace/name`` -> (source, channel, carriers) of each valid one.
        channels: declared channel name -> source.
        feeds: (source, field path, channel) of each declared feed.
    """

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    documents: int = 0
    destinations: dict[str, tuple[str, str, tuple[str, ...]]] = field(default_factory=dict)
    channels: dict[str, str] = field(default_factory=dict)
    feeds: list[tuple[str, str, str]] = field(default_factory=list)

    def error(self, source: str, line: str) -> None:
        """Record one problem of ``source``."""
        self.errors.append(f"{source}: {line}")


def check_document(report: Report, doc: Any, source: str) -> None:
    """Check one parsed document and record what it declares and what is wrong with it."""
    report.documents += 1
    if not isinstance(doc, Mapping):
        report.error(source, "<root>: must be a mapping")
        return
    kind = doc.get("kind")
    if kind == schema.KIND:
        _destination(report, doc, source)
    elif kind in ("List", f"{schema.KIND}List"):
        items = doc.get("items")
        if not isinstance(items, list):
            report.error(source, "items: must be a list")
            return
        for i, item in enumerate(items):
            sub = f"{source} items[{i}]"
            if isinstance(item, Mapping) and item.get("kind") == schema.KIND:
                _destination(report, item, sub)
            else:
                report.error(sub, f"kind: must be {schema.KIND}, not {_short(_kind(item))}")
    elif kind == schema.WORKER_CONFIG_KIND or (kind is None and "destination" in doc):
        try:
            load_worker_config(doc, source=source)
        except ManifestError as exc:
            for line in exc.errors:
                report.error(source, line)
    elif kind is None and ("feeds" in doc or "channels" in doc):
        unknown = sorted(set(doc) - {"feeds", "channels"})
        for key in unknown:
            report.error(source, f"{key}: unknown field (a declaration file has feeds, channels)")
        if "feeds" in doc:
            _feeds(report, doc["feeds"], source, "feeds")
        if "channels" in doc:
            _channels(report, doc["channels"], source, "channels")
    elif kind is None and isinstance(doc.get("ingest"), Mapping):
        ingest = doc["ingest"]
        if "channels" in ingest:
            _channels(report, ingest["channels"], source, "ingest.channels")
        if "feeds" in ingest:
            _feeds(report, ingest["feeds"], source, "ingest.feeds")
    else:
        report.error(
            source,
            f"kind: must be {schema.KIND} or {schema.WORKER_CONFIG_KIND}, not {_short(kind)}"
            " (or a file of feeds or channels, or the chart's values)",
        )


def _kind(item: Any) -> Any:
    return item.get("kind") if isinstance(item, Mapping) else None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _destination(report: Report, doc: Mapping[str, Any], source: str) -> None:
    try:
        valid = validate_manifest(doc, source=source)
    except ManifestError as exc:
        for line in exc.errors:
            report.error(source, line)
        return
    key = destination_key(valid)
    spec = valid["spec"]
    if key in report.destinations:
        first = report.destinations[key][0]
        report.error(source, f"metadata.name: {key} is declared twice (also {first})")
        return
    carriers = tuple(spec.get("carriers", ()))
    for other, (other_source, _, theirs) in report.destinations.items():
        for carrier in sorted(set(carriers) & set(theirs)):
            report.error(
                source, f"spec.carriers: {carrier} is already served by {other} ({other_source})"
            )
    report.destinations[key] = (source, spec["channel"], carriers)


def _feeds(report: Report, feeds: Any, source: str, where: str) -> None:
    for line in feed_problems({"feeds": feeds}):
        report.error(source, where + line[len("feeds") :] if line.startswith("feeds") else line)
    if isinstance(feeds, list):
        for i, node in enumerate(feeds):
            if isinstance(node, Mapping) and isinstance(node.get("channel"), str):
                report.feeds.append((source, f"{where}[{i}].channel", node["channel"]))


def _channels(report: Report, nodes: Any, source: str, where: str) -> None:
    found = list(channel_decls.problems(nodes, prefix=where))
    for line in found:
        report.error(source, line)
    if not isinstance(nodes, list):
        return
    for i, node in enumerate(nodes):
        name = node.get("name") if isinstance(node, Mapping) else None
        if not isinstance(name, str):
            continue  # reported above
        if name in report.channels and report.channels[name] != source:
            report.error(
                source,
                f"{where}[{i}].name: {name} is declared twice (also {report.channels[name]})",
            )
        report.channels.setdefault(name, source)


def finish(report: Report) -> Report:
    """The checks across documents that need all of them (undeclared channels)."""
    if report.channels:
        declared = ", ".join(sorted(report.channels))
        for key, (source, channel, _) in report.destinations.items():
            if channel not in report.channels:
                report.warnings.append(
                    f"{source}: spec.channel: {key} takes channel {channel}, which no channel"
                    f" declaration names (declared: {declared}); only HTTP ingest can feed it"
                )
        for source, where, channel in report.feeds:
            if channel not in report.channels:
                report.warnings.append(
                    f"{source}: {where}: {channel} is not a declared channel (declared:"
                    f" {declared}); only HTTP ingest can feed it"
                )
    return report


def check_files(paths: Iterable[Path]) -> Report:
    """Read and check every document of every file.

    Raises:
        OSError: a file cannot be read (a usage error for the command).
    """
    report = Report()
    for path in paths:
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            report.documents += 1
            report.error(str(path), f"byte {exc.start}: not UTF-8 text")
            continue
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark is not None else "?"
            report.documents += 1
            report.error(str(path), f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})")
            continue
        for i, doc in enumerate(docs, start=1):
            if doc is not None:
                check_document(report, doc, f"{path}#{i}")
    return finish(report)


@click.command("validate")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
def validate_command(files: tuple[Path, ...]) -> None:
    """Check Destination manifests, feeds files and ingest channel declarations offline.

    Every problem is printed with its file, document and field path; exit status 0 when all
    are valid, 1 when any is not, 2 for a usage error. Needs no database and no cluster.
    """
    try:
        report = check_files(files)
    except OSError as exc:
        raise click.UsageError(f"cannot read {exc.filename}: {exc.strerror}") from None
    for line in report.errors:
        click.echo(line)
    for line in report.warnings:
        click.echo(f"warning: {line}")
    n = len(files)
    counted = f"{report.documents} document(s) in {n} file(s)"
    if report.errors:
        click.echo(f"{counted}: {len(report.errors)} problem(s)")
        sys.exit(EXIT_INVALID)
    click.echo(f"{counted}: valid")
