"""Every YAML or JSON file inturn reads is bounded in bytes, aliases, depth and time, refuses a
key given twice, and answers a bad file with one line and exit 1 or 2 (issue 41, part 4):
through the parser itself and through the real commands (``inturn validate``, ``inturn local``,
``inturn worker``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inturn.worker.feeds.declare import FeedsError, load_feeds
from inturn.worker.ingest.credentials import CredentialsError, CredentialsFile
from inturn.worker.spec.destination import ManifestError, load_file
from inturn.worker.spec.documents import (
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    DocumentError,
    load_documents,
)

MAIN = "import sys; from inturn.worker.cli import main; sys.argv[0] = 'inturn'; main()"


def alias_bomb(levels: int = 9) -> str:
    """The "billion laughs": each level a list of nine aliases of the one before (about 1 KiB,
    9**levels values once expanded)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        refs = ", ".join(f"*a{i - 1}" for _ in range(9))
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


HOSTILE = {
    "alias-bomb": (alias_bomb(), "aliases expand to more than"),
    "deep-flow": ("[" * 10_000 + "]" * 10_000, "nested deeper than"),
    "duplicate-key": (
        "apiVersion: inturn.dev/v1alpha1\nkind: Destination\nmetadata: {name: a}\n"
        "spec:\n  channel: adt\n  channel: lab\n",
        "key 'channel' given twice",
    ),
    "not-yaml": ("a: [1, 2\n", "not valid YAML"),
    "not-utf8": (None, "not UTF-8"),
}


def test_an_alias_bomb_is_refused_without_expanding_it() -> None:
    assert len(alias_bomb()) < 1100
    with pytest.raises(DocumentError, match="aliases expand to more than 1,000,000 values"):
        load_documents(alias_bomb())


def test_modest_aliases_are_read() -> None:
    [doc] = load_documents("base: &b {x: 1}\nother: *b\nlist: [*b, *b]\n")
    assert doc == {"base": {"x": 1}, "other": {"x": 1}, "list": [{"x": 1}, {"x": 1}]}


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 10_000])
def test_deep_nesting_is_refused_in_one_line(depth: int) -> None:
    with pytest.raises(DocumentError, match=f"nested deeper than {MAX_DEPTH} levels") as caught:
        load_documents("[" * depth + "]" * depth)
    assert "\n" not in str(caught.value)
    with pytest.raises(DocumentError, match="nested deeper"):
        load_documents('{"a": ' * depth + "1" + "}" * depth)  # JSON


def test_nesting_at_the_bound_is_read() -> None:
    assert load_documents("[" * MAX_DEPTH + "]" * MAX_DEPTH)[0] is not None


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a: 1\nb: 2\na: 3\n", "line 3"),
        ('{"a": 1, "a": 2}', "line 1"),
        ("x:\n  - {k: 1, k: 1}\n", "line 2"),
        ("1: a\n1: b\n", "line 2"),
    ],
)
def test_a_key_given_twice_is_refused(text: str, line: str) -> None:
    with pytest.raises(DocumentError, match=f"{line}: key .* given twice"):
        load_documents(text)


def test_merge_keys_still_override() -> None:
    [doc] = load_documents("base: &b {x: 1, y: 2}\nthis:\n  <<: *b\n  y: 3\n")
    assert doc["this"] == {"x": 1, "y": 3}


def test_a_file_past_the_byte_bound_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with path.open("wb") as f:
        f.write(b"# " + b"x" * (MAX_DOCUMENT_BYTES + 10) + b"\n")
    with pytest.raises(ManifestError, match="larger than 4 MiB"):
        load_file(path)


def test_every_reader_uses_the_bounds(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    with pytest.raises(ManifestError, match="aliases expand"):
        load_file(bomb)
    with pytest.raises(FeedsError, match="aliases expand"):
        load_feeds(bomb)
    with pytest.raises(CredentialsError, match="aliases expand"):
        CredentialsFile(str(bomb))
    from inturn.worker.console.auth import AuthConfigError, load_auth

    with pytest.raises(AuthConfigError, match="aliases expand"):
        load_auth(bomb)


def _write(tmp_path: Path, name: str) -> Path:
    text, _ = HOSTILE[name]
    path = tmp_path / f"{name}.yaml"
    if text is None:
        path.write_bytes(b"apiVersion: \xff\xfe\n")
    else:
        path.write_text(text)
    return path


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTURN_")}
    env["INTURN_LOCAL_DISCOVERY"] = "off"
    return subprocess.run(
        [sys.executable, "-c", MAIN, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("name", ["alias-bomb", "deep-flow", "duplicate-key", "not-utf8"])
@pytest.mark.parametrize("command", ["validate", "local", "worker"])
def test_the_commands_answer_a_hostile_file_in_one_line(
    tmp_path: Path, name: str, command: str
) -> None:
    path = _write(tmp_path, name)
    if command == "validate":
        args = ["validate", str(path)]
    elif command == "local":
        args = [
            "local",
            "--listen",
            "adt=0",
            "-f",
            str(path),
            "--dsn",
            "postgresql://127.0.0.1:9/x",
        ]
    else:
        args = ["worker", "--http-port", "0", "-f", str(path)]
    done = _run(*args, cwd=tmp_path)
    assert done.returncode in (1, 2), done.stderr
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
    _, says = HOSTILE[name]
    assert says is not None and says in done.stdout + done.stderr
    # one line on stderr for the commands that stop; validate reports on stdout
    err = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(err) <= 1, done.stderr
