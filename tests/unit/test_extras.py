"""Every command without an optional extra (``operator``, ``local``, ``tracing``) installed:
its help still works, and a command that needs the extra says which, in one line, never a
traceback. The extras' libraries are made unimportable in a Python of its own (``None`` in
``sys.modules``: the ``ModuleNotFoundError`` an absent package raises)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click

from inturn.worker.cli import EXTRAS, cli

#: Every top-level command: inturn's own and the rule packs'.
COMMANDS = cli.list_commands(click.Context(cli))

#: Run in a Python without the extras: walks every command and subcommand, runs each with
#: ``--help`` and with no arguments, and prints what each printed and its exit status.
WALK = """
import contextlib, io, json, sys
for name in EXTRAS:
    sys.modules[name] = None
import click
from inturn.worker.cli import cli, main

def paths(cmd, path, ctx):
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            yield from paths(cmd.get_command(ctx, name), [*path, name], ctx)
    else:
        yield path

def run(args):
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # what a user would see as a traceback
            code, err = -1, io.StringIO(f"Traceback: {type(exc).__name__}: {exc}")
    return {"args": args, "code": code, "stderr": err.getvalue()}

found = list(paths(cli, [], click.Context(cli)))  # every command that runs (no group)
print(json.dumps([run([*p, "--help"]) for p in found] + [run(p) for p in found]))
"""


def walk(*extra_runs: list[str]) -> list[dict[str, object]]:
    code = f"EXTRAS = {sorted(EXTRAS)!r}\n{WALK}"
    for args in extra_runs:
        code += f"print(json.dumps(run({args!r})))\n"
    env = {k: v for k, v in os.environ.items() if k != "INTURN_DSN"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env=env,
        check=True,
    )
    lines = done.stdout.strip().splitlines()
    return [
        *json.loads(lines[-1 - len(extra_runs)]),
        *(json.loads(x) for x in lines[-len(extra_runs) :]),
    ]


def test_without_the_extras_every_command_answers_in_one_line(tmp_path: Path) -> None:
    manifest = Path(__file__).resolve().parents[2] / "examples" / "local-mllp.yaml"
    runs = walk(
        ["operator", "--image", "inturn:test"],
        ["local", "-f", str(manifest), "--data-dir", str(tmp_path), "--listen", "adt=0"],
    )
    tops = {r["args"][0] for r in runs}  # type: ignore[index]
    assert tops == set(COMMANDS)
    helps = [r for r in runs if r["args"][-1] == "--help"]  # type: ignore[index]
    assert [r["args"] for r in helps if r["code"] != 0] == []
    assert len(helps) > len(COMMANDS)  # the groups' subcommands, each
    tracebacks = [r["args"] for r in runs if "Traceback" in str(r["stderr"])]
    assert tracebacks == []
    # a refusal is one line (log lines before it are the command's log, not its error)
    errors = [str(r["stderr"]) for r in runs if r["code"] not in (0, None)]
    assert len(errors) > len(COMMANDS)
    said = [[x for x in e.splitlines() if x.startswith("inturn: ")] for e in errors]
    assert [e for e, lines in zip(errors, said, strict=True) if len(lines) != 1] == []
    operator, local = runs[-2:]
    assert (operator["code"], operator["stderr"]) == (
        2,
        "inturn: error: inturn operator needs kopf: pip install 'inturn[operator]'\n",
    )
    assert local["code"] == 2 and str(local["stderr"]).endswith(
        "inturn: error: the embedded Postgres needs the local extra"
        " (pip install 'inturn[local]'); or pass --dsn\n"
    )
