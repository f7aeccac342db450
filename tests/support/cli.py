"""The ``inturn`` command run inside the test's own process, for tests about what a command says
and how it exits, not about a process starting.

A Python interpreter that imports inturn costs about a second of CPU on the two-core machine (0.8 s
of user time for ``inturn --help``), which made a test of ``inturn validate``'s output a second
long; here it is the command's own work. What the test sees is what it saw of the subprocess: a
:class:`subprocess.CompletedProcess` with the exit code, stdout and stderr as text. The command
runs as the console script runs it (:func:`inturn.worker.cli.main`: one-line errors, exit codes
0/1/2), in ``cwd``, with every ``INTURN_*`` variable removed for its duration (``env`` adds some
back), its output captured by click's test runner.

Tests whose subject is the process itself (its memory bound, its signals, its import time, what
a fresh interpreter finds) keep running ``inturn`` as a subprocess.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from click.testing import CliRunner


def inturn(
    *args: str | Path, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``inturn <args>`` in this process from ``cwd``; its exit code and output."""
    from inturn.worker.cli import main

    argv = [str(a) for a in args]
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("INTURN_")}
    isolated = CliRunner().isolation(env={**unset, **(env or {})})
    with isolated as (out, err, _), contextlib.chdir(cwd):
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            if isinstance(exc.code, str):  # sys.exit("message"): printed, exit 1
                print(exc.code, file=sys.stderr)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
    return subprocess.CompletedProcess(
        ["inturn", *argv], code, out.getvalue().decode(), err.getvalue().decode()
    )
