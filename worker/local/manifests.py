"""The Destination manifests ``inturn local`` runs: the files found under its ``-f`` paths,
what changes when one is edited, and every destination they declare, checked before anything
starts (validated as ``kubectl apply`` would have the operator validate them).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from inturn.worker.senders import registry as senders
from inturn.worker.spec.config import WorkerConfig
from inturn.worker.spec.destination import load_file

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


def manifest_files(paths: list[Path]) -> list[Path]:
    """The manifest files under ``paths`` (files as given; directories searched recursively
    for ``*.yaml``, ``*.yml`` and ``*.json``), sorted."""
    found: set[Path] = set()
    for path in paths:
        if path.is_dir():
            found.update(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES)
        elif path.exists():
            found.add(path)
    return sorted(found)


def fingerprint(files: list[Path]) -> tuple[tuple[str, int, int], ...]:
    """What changes when a file is added, removed or edited (path, mtime ns, size)."""
    out = []
    for f in files:
        with contextlib.suppress(OSError):
            st = f.stat()
            out.append((str(f), st.st_mtime_ns, st.st_size))
    return tuple(out)


def load_all(paths: list[Path], secrets_dir: Path | None) -> dict[str, WorkerConfig]:
    """Load every Destination found under ``paths``, keyed by ``namespace/name``.

    Raises:
        ManifestError: a file is invalid (the message names the file and the field).
        click.ClickException: two files declare the same destination, or none is found.
    """
    configs: dict[str, WorkerConfig] = {}
    served: dict[str, str] = {}
    files = manifest_files(paths)
    for f in files:
        for cfg in load_file(f, secrets_dir=secrets_dir):
            if cfg.destination in configs:
                raise click.ClickException(f"{f}: destination {cfg.destination} is declared twice")
            for carrier in cfg.carriers:
                if carrier in served:
                    raise click.ClickException(
                        f"{f}: {cfg.destination}: spec.carriers: {carrier} is already served"
                        f" by {served[carrier]}"
                    )
                served[carrier] = cfg.destination
            configs[cfg.destination] = cfg
    return configs
