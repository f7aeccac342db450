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

A FILE may be a folder: every ``*.yaml``, ``*.yml`` and ``*.json`` under it is read, as
``inturn local -f`` reads one. A file (or folder) that declares no document is a problem.

The schema's rules that tie fields together (``spec.sender: exactly one of mllp, http, sftp
must be set``) are checked on every part that is well typed, in the same pass as the type
errors elsewhere: one run lists every problem the schema allows.

``--preview FILE.hl7``: once every document is valid, what each Destination's receiver would get
for the message in FILE.hl7: the message as its profile (``spec.profile``) shapes it, one
segment a line, or the refusal naming the field and the value (exit status 1). MSH-13 shows 1
where the profile numbers messages (the worker takes the numbers from its queue's counter).

Output: one line per problem on stdout, ``FILE#N: field.path: what is wrong`` (N counts the
file's documents from 1), warnings as ``warning: ...``, then a summary line. Exit status: 0 when
every document is valid (warnings do not count), 1 when any problem was found, 2 when a file is
unreadable (not UTF-8 text, not YAML, or the system refuses to read it; the other files are
still checked and their problems printed) or for a usage error (no FILE, a path that does not
exist).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from inturn.worker.feeds.declare import feed_problems
from inturn.worker.hl7.profile import Profile, ProfileRefusal, compile_profile, shaped
from inturn.worker.local.manifests import MANIFEST_SUFFIXES, manifest_files
from inturn.worker.spec import channels as channel_decls
from inturn.worker.spec import schema
from inturn.worker.spec.destination import (
    ManifestError,
    destination_key,
    load_worker_config,
    validate_manifest,
)
from inturn.worker.spec.documents import DocumentError, read_documents

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
        files: how many files were read (a folder counts its manifest files).
        unreadable: how many of them could not be parsed (not UTF-8, not YAML) or read.
        destinations: ``namespace/name`` -> (source, channel, carriers) of each valid one.
        channels: declared channel name -> source.
        feeds: (source, field path, channel) of each declared feed.
    """

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    documents: int = 0
    files: int = 0
    unreadable: int = 0
    destinations: dict[str, tuple[str, str | None, tuple[str, ...]]] = field(default_factory=dict)
    channels: dict[str, str] = field(default_factory=dict)
    feeds: list[tuple[str, str, str]] = field(default_factory=list)
    #: ``namespace/name`` -> the compiled profile of each valid Destination (None: none).
    profiles: dict[str, Profile | None] = field(default_factory=dict)

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
            cfg = load_worker_config(doc, source=source)
        except ManifestError as exc:
            for line in exc.errors:
                report.error(source, line)
        else:
            report.profiles.setdefault(cfg.destination, cfg.profile)
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
    """One Destination: its own problems, and (even when it has some, so that one pass says
    everything) whether its name was declared before."""
    valid: dict[str, Any] | None
    try:
        valid = validate_manifest(doc, source=source)
    except ManifestError as exc:
        for line in exc.errors:
            report.error(source, line)
        valid = None
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return  # reported above
    key = destination_key(doc)
    if key in report.destinations:
        first = report.destinations[key][0]
        report.error(source, f"metadata.name: {key} is declared twice (also {first})")
        return
    if valid is None:
        report.destinations[key] = (source, None, ())
        return
    spec = valid["spec"]
    carriers = tuple(spec.get("carriers", ()))
    for other, (other_source, _, theirs) in report.destinations.items():
        for carrier in sorted(set(carriers) & set(theirs)):
            report.error(
                source, f"spec.carriers: {carrier} is already served by {other} ({other_source})"
            )
    report.destinations[key] = (source, spec["channel"], carriers)
    report.profiles[key] = compile_profile(spec.get("profile"))


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
            if channel is not None and channel not in report.channels:
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
    """Read and check every document of every file; a folder stands for the manifest files
    under it (:func:`inturn.worker.local.manifests.manifest_files`, as ``inturn local -f``).

    A file that cannot be read or parsed is counted in ``unreadable`` (and reported); the others
    are still checked.
    """
    report = Report()
    for given in paths:
        files = manifest_files([given]) if given.is_dir() else [given]
        if given.is_dir() and not files:
            kinds = ", ".join(f"*{s}" for s in MANIFEST_SUFFIXES)
            report.error(str(given), f"no documents (no {kinds} file under this folder)")
        for path in files:
            _check_file(report, path)
    return finish(report)


def _check_file(report: Report, path: Path) -> None:
    """Read, parse and check one file's documents into ``report``."""
    report.files += 1
    try:
        docs = read_documents(path)
    except OSError as exc:
        report.unreadable += 1
        report.error(str(path), f"unreadable: {exc.strerror}")
        return
    except DocumentError as exc:
        report.unreadable += 1
        report.error(str(path), f"unreadable: {exc}")
        return
    found = [(i, doc) for i, doc in enumerate(docs, start=1) if doc is not None]
    if not found:
        report.error(str(path), "no documents (the file is empty or holds only comments)")
    for i, doc in found:
        check_document(report, doc, f"{path}#{i}")


#: Largest message ``--preview`` reads, bytes (ingest's own frame limit is smaller).
MAX_PREVIEW_BYTES = 64 * 1024 * 1024


def preview(message: bytes, profiles: Mapping[str, Profile | None]) -> tuple[list[str], bool]:
    """What each destination's receiver would get for ``message``: the lines to print, and
    whether every profile could shape it (False: some refused it)."""
    lines: list[str] = []
    every = True
    for key in sorted(profiles):
        profile = profiles[key]
        try:
            sent = shaped(message, profile, 1)
        except ProfileRefusal as exc:
            lines.append(f"{key}: refused: {exc.describe()}")
            every = False
            continue
        codec = profile.charset.codec if profile is not None and profile.charset else "utf-8"
        how = "as stored (no profile)" if profile is None else "as sent"
        lines.append(f"{key}: {how}, {len(sent):,} bytes ({len(message):,} stored):")
        text = sent.decode(codec, "backslashreplace")
        lines.extend(
            f"  {segment}" for segment in text.replace("\r\n", "\r").split("\r") if segment
        )
    return lines, every


@click.command("validate")
@click.argument(
    "files",
    nargs=-1,
    required=True,
    metavar="FILE|DIR...",
    type=click.Path(exists=True, path_type=Path),
)
@click.option(
    "--preview",
    "message",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="An HL7 message file: print what each Destination's receiver would get for it"
    " (spec.profile applied), or why its profile refuses it.",
)
def validate_command(files: tuple[Path, ...], message: Path | None) -> None:
    """Check Destination manifests, feeds files and ingest channel declarations offline.

    A DIR is read as 'inturn local -f' reads it (every .yaml, .yml and .json file under it). Every
    problem is printed with its file, document and field path; exit status 0 when all are
    valid, 1 when any is not (an empty file too: no documents), 2 when a file is unreadable
    (not UTF-8, not YAML) or for a usage error. Needs no database and no cluster.

    With --preview MESSAGE.hl7, and every document valid, what each Destination's receiver
    would get for that message is printed (its profile applied), one segment a line; exit
    status 1 when a profile refuses it.
    """
    report = check_files(files)
    for line in report.errors:
        click.echo(line)
    for line in report.warnings:
        click.echo(f"warning: {line}")
    counted = f"{report.documents} document(s) in {report.files} file(s)"
    if report.errors:
        unreadable = f", {report.unreadable} file(s) unreadable" if report.unreadable else ""
        click.echo(f"{counted}: {len(report.errors)} problem(s){unreadable}")
        sys.exit(EXIT_USAGE if report.unreadable else EXIT_INVALID)
    click.echo(f"{counted}: valid")
    if message is not None:
        with message.open("rb") as handle:
            data = handle.read(MAX_PREVIEW_BYTES + 1)
        if len(data) > MAX_PREVIEW_BYTES:
            click.echo(f"{message}: larger than {MAX_PREVIEW_BYTES:,} bytes; not previewed")
            sys.exit(EXIT_USAGE)
        lines, every = preview(data, report.profiles)
        for line in lines or ["no Destination to preview"]:
            click.echo(line)
        if not every:
            sys.exit(EXIT_INVALID)
