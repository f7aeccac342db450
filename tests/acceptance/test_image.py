"""The container image: built with podman (`make image`'s script) and checked from inside.

Skipped, with the reason, where podman or debootstrap is missing or we are not root (image
mounts, chroot and debootstrap need root). The base is made here by debootstrap, so no registry
is needed; the first run takes about a minute more for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from inturn.worker.operations import packs
from tests.support.image_check import checker

ROOT = Path(__file__).resolve().parents[2]
IMAGE = f"localhost/inturn:test-{os.getpid()}"

missing = [tool for tool in ("podman", "debootstrap", "chroot") if shutil.which(tool) is None]
pytestmark = [
    pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)} (apt-get install)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="podman image mount and debootstrap need root"),
]


def cli_commands() -> list[str]:
    """The subcommands of the ``inturn`` CLI in this checkout, but the optional packs' (the
    image is built without the reservations extra)."""
    from inturn.worker.cli import cli

    return sorted(set(cli.list_commands(click.Context(cli))) - set(packs.commands()))


def test_image_builds_and_holds_what_every_component_needs() -> None:
    version = subprocess.run(
        [str(ROOT / "image" / "version.sh")], capture_output=True, text=True, timeout=300
    ).stdout.strip()
    built = subprocess.run(
        [str(ROOT / "image" / "build.sh"), IMAGE], capture_output=True, text=True, timeout=1500
    )
    try:
        assert built.returncode == 0, built.stdout + built.stderr
        assert "compilers: none" in built.stdout
        facts = checker().inspect(IMAGE)
    finally:
        subprocess.run(["podman", "untag", IMAGE, IMAGE], capture_output=True, timeout=120)
    assert facts["entrypoint"] == ["inturn"]
    assert facts["version"] == f"inturn, version {version}"
    assert facts["help"]["worker"] == "Usage: inturn worker [OPTIONS]"
    # every command of the CLI the image was built from, none missing (a stale layer would
    # be): check.py reads them from the image's own `inturn --help`, so a new command needs
    # no list to be kept; the components' commands are always checked
    assert set(facts["help"]) - set(packs.commands()) == set(cli_commands())
    assert set(checker().REQUIRED) <= set(facts["help"])
    for command, line in facts["help"].items():
        assert line.startswith(f"Usage: inturn {command}"), line
    assert (facts["user"], facts["uid"], facts["gid"]) == ("inturn", 10001, 10001)
    assert facts["compilers"] == []
    assert 50e6 < facts["size_bytes"] < 600e6
