"""Checks a built inturn image without running a container: mount it, chroot into it.

    python3 image/check.py IMAGE

``podman run`` is not available everywhere (some sandboxes refuse its rlimits), so the image's
root filesystem is mounted with ``podman image mount`` and its entry point is run with
``chroot --userspec`` as the image's own user, with the image's environment. Prints one line per
fact and exits 1 if a check fails: ``inturn --version``, ``--help`` of every component's command,
the user (not root, UID 10001), no C compiler, the size. Needs root (mount, chroot) and podman.
Standard library only: it runs with the system's python3.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The subcommands the components run (the chart's pods, CronJobs and Jobs): each must be in
#: the image and load (its imports are installed). The image's other commands are read from its
#: own ``inturn --help`` (:func:`commands`), so that a new command needs no edit here; a rule
#: pack's commands (``bookings``) are there only in an image built with its extra.
REQUIRED = ("worker", "operator", "ingest", "migrate", "purge", "crd", "sweep", "console")
UID = 10001
#: A command's line in the ``Commands:`` section of click's help: two spaces, then the name
#: (a wrapped description continues further in).
COMMAND_LINE = re.compile(r"^  ([a-z][\w-]*)(?:\s|$)")
UID = 10001
#: Names of C/C++ compilers (and their versioned or triplet-prefixed forms).
COMPILER = re.compile(
    r"^(?:[\w-]+-linux-gnu-)?(?:gcc|g\+\+|cc|c\+\+|clang|clang\+\+|tcc)(?:-[\d.]+)?$"
)


def commands(help_text: str) -> list[str]:
    """The subcommand names of a click group's ``--help`` text (its ``Commands:`` section), in
    their order; empty when it has none."""
    names: list[str] = []
    section = False
    for line in help_text.splitlines():
        if line.strip() == "Commands:":
            section = True
        elif section and line and not line.startswith(" "):
            section = False
        elif section and (found := COMMAND_LINE.match(line)):
            names.append(found.group(1))
    return names


def podman(*args: str) -> str:
    """Run ``podman ARGS`` and return its stdout (CalledProcessError on failure)."""
    return subprocess.run(
        ["podman", *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def inspect(image: str) -> dict[str, Any]:
    """Facts about ``image``: {version, help: {command: first line or error}, user, uid, gid,
    compilers: [paths], size_bytes, entrypoint}."""
    config = json.loads(podman("image", "inspect", image))[0]
    cfg = config["Config"]
    user = cfg.get("User") or "0"
    env = cfg.get("Env") or []
    workdir = cfg.get("WorkingDir") or "/"
    entrypoint = cfg.get("Entrypoint") or []
    root = Path(podman("image", "mount", image))
    try:

        def run(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [
                    "chroot",
                    f"--userspec={user}",
                    str(root),
                    "/usr/bin/env",
                    "-i",
                    "-C",
                    workdir,
                    *env,
                    *argv,
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )

        version = run(*entrypoint, "--version")
        listed = commands(run(*entrypoint, "--help").stdout)
        helps = {}
        for command in dict.fromkeys([*REQUIRED, *listed]):
            done = run(*entrypoint, command, "--help")
            out = done.stdout if done.returncode == 0 else f"exit {done.returncode}: {done.stderr}"
            helps[command] = (out.strip().splitlines() or [""])[0]
        ids = run("id", "-u").stdout.strip(), run("id", "-g").stdout.strip()
        name = run("id", "-un").stdout.strip()
        path_dirs = [d for e in env if e.startswith("PATH=") for d in e[5:].split(":")]
        compilers = sorted(
            str(p.relative_to(root).as_posix())
            for d in {*path_dirs, "/usr/bin", "/usr/local/bin", "/bin"}
            if (root / d.lstrip("/")).is_dir()
            for p in (root / d.lstrip("/")).iterdir()
            if COMPILER.match(p.name)
        )
    finally:
        podman("image", "unmount", image)
    return {
        "image": image,
        "entrypoint": entrypoint,
        "version": version.stdout.strip() or f"exit {version.returncode}: {version.stderr}",
        "help": helps,
        "user": name,
        "uid": int(ids[0]) if ids[0].isdigit() else -1,
        "gid": int(ids[1]) if ids[1].isdigit() else -1,
        "compilers": compilers,
        "size_bytes": int(config["Size"]),
    }


def problems(facts: dict[str, Any], version: str) -> list[str]:
    """What is wrong with ``facts`` for an image of inturn ``version`` (empty: all good)."""
    found = []
    if facts["entrypoint"] != ["inturn"]:
        found.append(f"entry point is {facts['entrypoint']}, not ['inturn']")
    if facts["version"] != f"inturn, version {version}":
        found.append(f"inturn --version said {facts['version']!r}")
    for command, line in facts["help"].items():
        if not line.startswith(f"Usage: inturn {command}"):
            found.append(f"inturn {command} --help said {line!r}")
    if facts["uid"] != UID or facts["gid"] != UID or facts["user"] != "inturn":
        found.append(f"runs as {facts['user']} {facts['uid']}:{facts['gid']}, not inturn {UID}")
    if facts["compilers"]:
        found.append(f"compilers inside: {', '.join(facts['compilers'])}")
    return found


def main(argv: list[str]) -> int:
    """``check.py IMAGE [VERSION]``: print the facts, return 1 if any check fails."""
    if len(argv) not in (1, 2):
        print("usage: check.py IMAGE [VERSION]", file=sys.stderr)
        return 2
    image = argv[0]
    version = argv[1] if len(argv) == 2 else image.rsplit(":", 1)[-1]
    facts = inspect(image)
    print(f"image {image}")
    print(f"  inturn --version: {facts['version']}")
    for command, line in facts["help"].items():
        print(f"  inturn {command} --help: {line}")
    print(f"  user: {facts['user']} (uid {facts['uid']}, gid {facts['gid']})")
    print(f"  compilers: {', '.join(facts['compilers']) or 'none'}")
    print(f"  size: {facts['size_bytes'] / 1e6:.0f} MB ({facts['size_bytes']} bytes)")
    found = problems(facts, version)
    for problem in found:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
