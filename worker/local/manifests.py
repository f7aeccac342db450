"""The Destination manifests ``inturn local`` runs: the files found under its ``-f`` paths,
what changes when one is edited, and every destination they declare, checked before anything
starts (validated as ``kubectl apply`` would have the operator validate them).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

import click

from inturn.worker.senders import registry as senders
from inturn.worker.spec.config import WorkerConfig
from inturn.worker.spec.destination import ManifestError, load_file

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def check_sender(cfg: WorkerConfig) -> None:
    """Run the sender kind's start-up checks (its files exist, it can be built), so that a
    missing TLS file or key is reported before anything starts.

    Raises:
        click.ClickException: a check failed (the message names the destination).
    """
    problem = senders.first_problem(cfg.destination, cfg.sender)
    if problem is not None:
        raise click.ClickException(problem)


def manifest_files(paths: list[Path], skip: Iterable[Path] = ()) -> list[Path]:
    """The manifest files under ``paths``, sorted.

    A file given is taken as it is. A directory is searched recursively for ``*.yaml``,
    ``*.yml`` and ``*.json`` files, leaving out hidden files and folders (a name starting with
    ``.``, below the directory given: ``.inturn/``, ``.git/``, an editor's swap file) and every
    folder in ``skip`` (``inturn local``'s ``--data-dir``, wherever it points: its embedded
    Postgres keeps JSON files of its own there).
    """
    skipped = {s.resolve() for s in skip}
    found: set[Path] = set()
    for path in paths:
        if not path.is_dir():
            if path.exists():
                found.add(path)
            continue
        for top, dirs, files in os.walk(path):
            root = Path(top)
            dirs[:] = sorted(
                d for d in dirs if not d.startswith(".") and (root / d).resolve() not in skipped
            )
            found.update(
                root / f
                for f in files
                if not f.startswith(".") and Path(f).suffix in MANIFEST_SUFFIXES
            )
    return sorted(found)


def fingerprint(files: list[Path]) -> tuple[tuple[str, int, int], ...]:
    """What changes when a file is added, removed or edited (path, mtime ns, size)."""
    out = []
    for f in files:
        with contextlib.suppress(OSError):
            st = f.stat()
            out.append((str(f), st.st_mtime_ns, st.st_size))
    return tuple(out)


def load_all(
    paths: list[Path], secrets_dir: Path | None, skip: Iterable[Path] = ()
) -> dict[str, WorkerConfig]:
    """Load every Destination found under ``paths`` (:func:`manifest_files`, leaving out the
    folders in ``skip``), keyed by ``namespace/name``.

    Every file is read, so that one error names every problem (a line each).

    Raises:
        ManifestError: a file is invalid (the message names the file and the field).
        click.ClickException: two files declare the same destination, or none is found; or
            several problems (one line each).
    """
    configs: dict[str, WorkerConfig] = {}
    declared: dict[str, Path] = {}
    served: dict[str, str] = {}
    problems: list[click.ClickException | ManifestError] = []
    files = manifest_files(paths, skip)
    for f in files:
        try:
            loaded = load_file(f, secrets_dir=secrets_dir)
        except (ManifestError, click.ClickException) as exc:
            problems.append(exc)
            continue
        for cfg in loaded:
            if cfg.destination in configs:
                problems.append(
                    click.ClickException(
                        f"{f}: destination {cfg.destination} is declared twice (also in"
                        f" {declared[cfg.destination]})"
                    )
                )
                continue
            taken = [c for c in cfg.carriers if c in served]
            if taken:
                problems.append(
                    click.ClickException(
                        f"{f}: {cfg.destination}: spec.carriers: {taken[0]} is already served"
                        f" by {served[taken[0]]}"
                    )
                )
                continue
            served.update(dict.fromkeys(cfg.carriers, cfg.destination))
            declared[cfg.destination] = f
            configs[cfg.destination] = cfg
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise click.ClickException("\n".join(_text(p) for p in problems))
    return configs


def _text(problem: click.ClickException | ManifestError) -> str:
    return problem.format_message() if isinstance(problem, click.ClickException) else str(problem)
