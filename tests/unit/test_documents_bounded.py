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
from inturn.worker.spec import documents
from inturn.worker.spec.destination import ManifestError, load_file
from inturn.worker.spec.documents import (
    MAX_ALIASES,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    MAX_EXPANDED_NODES,
    DocumentError,
    check_shape,
    load_documents,
    load_json,
)

#: The real command line, with the time bound out of the way (:func:`no_time_bound`): a file of
#: 100,001 values takes 3 to 4 s to refuse on a quiet two-core machine and passed 10 s on a busy
#: one, answering "took longer" instead of the bound that file is about.
MAIN = (
    "import sys; import inturn.worker.spec.documents as d; d.MAX_PARSE_SECONDS = 600.0;"
    " from inturn.worker.cli import main; sys.argv[0] = 'inturn'; main()"
)


@pytest.fixture(autouse=True)
def no_time_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test here is about one bound (bytes, aliases, depth, values, keys), never the time
    one, which depends on how busy the machine is: it is lifted to 600 s (its own test sets it
    back to 0)."""
    monkeypatch.setattr(documents, "MAX_PARSE_SECONDS", 600.0)


def test_parsing_past_the_time_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(documents, "MAX_PARSE_SECONDS", 0.0)
    with pytest.raises(DocumentError, match="parsing took longer than 0 s"):
        load_documents("a: [1, 2, 3]\nb: {c: d}\n")


def alias_bomb(levels: int = 9) -> str:
    """The "billion laughs": each level a list of nine aliases of the one before (about 1 KiB,
    9**levels values once expanded)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        refs = ", ".join(f"*a{i - 1}" for _ in range(9))
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


def merge_bomb(keys: int = 2000, merges: int = 900) -> str:
    """One mapping of ``keys`` keys merged (``<<``) into ``merges`` others: PyYAML copies its
    pairs into each (a 150 KB file of this shape took 34 s and 1.5 GiB before the bound)."""
    big = "big: &B {" + ", ".join(f"k{i}: 1" for i in range(keys)) + "}\n"
    return big + "".join(f"m{i}: {{<<: *B}}\n" for i in range(merges))


def nested_merge_bomb(levels: int = 24) -> str:
    """pyyaml#897's shape: each level merges the one before twice."""
    lines = ["L0: &L0 {k0: v0}"]
    for n in range(1, levels + 1):
        lines.append(f"L{n}: &L{n} {{<<: [*L{n - 1}, *L{n - 1}], k{n}: v}}")
    return "\n".join(lines) + "\n"


def deep_aliases(levels: int = 40) -> str:
    """Each anchor an alias of the one before nested 60 levels down: every level is under the
    depth bound as written, the data nests ``levels`` * 60 deep once aliases are followed."""
    lines = ["a0: &a0 " + "[" * 60 + "x" + "]" * 60]
    for n in range(1, levels):
        lines.append(f"a{n}: &a{n} " + "[" * 60 + f"*a{n - 1}" + "]" * 60)
    return "\n".join(lines) + "\n"


HOSTILE = {
    "alias-bomb": (alias_bomb(), "aliases expand to more than"),
    "merge-bomb": (merge_bomb(), "aliases expand to more than"),
    "many-values": ("".join(f"- {i}\n" for i in range(MAX_EXPANDED_NODES + 1)), "more than"),
    "deep-flow": ("[" * 10_000 + "]" * 10_000, "nested deeper than"),
    "duplicate-key": (
        "apiVersion: inturn.dev/v1alpha1\nkind: Destination\nmetadata: {name: a}\n"
        "spec:\n  channel: adt\n  channel: lab\n",
        "key 'channel' given twice",
    ),
    "not-yaml": ("a: [1, 2\n", "not valid YAML"),
    "not-utf8": (None, "not UTF-8"),
    "fifty-mb": (None, "larger than 4 MiB"),
}


@pytest.mark.parametrize(
    "text",
    [
        alias_bomb(),
        alias_bomb(6),  # 9**6 = 531,441 values from 700 bytes
        "a: &a {x: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\nb: &b [" + ", ".join(["*a"] * 500) + "]\n"
        "c: [" + ", ".join(["*b"] * 500) + "]\n",
        merge_bomb(),
        nested_merge_bomb(),
    ],
    ids=["billion-laughs", "six-levels", "wide", "merge", "nested-merge"],
)
def test_an_alias_bomb_is_refused_without_expanding_it(text: str) -> None:
    assert len(text) < 200_000
    with pytest.raises(
        DocumentError, match=f"aliases expand to more than {MAX_EXPANDED_NODES:,} values"
    ):
        load_documents(text)


def test_aliases_that_nest_deeper_once_followed_are_refused() -> None:
    with pytest.raises(DocumentError, match=f"nest deeper than {MAX_DEPTH} levels once expanded"):
        load_documents(deep_aliases())


def test_an_alias_of_its_own_anchor_is_refused() -> None:
    with pytest.raises(DocumentError, match="aliases expand"):
        load_documents("a: &a [1, *a]\n")


def test_more_aliases_than_the_bound_are_refused() -> None:
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_ALIASES + 1)) + "]\n"
    with pytest.raises(DocumentError, match=f"more than {MAX_ALIASES:,} aliases"):
        load_documents(text)
    # at the bound: read
    load_documents("a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_ALIASES - 1)) + "]\n")


@pytest.mark.slow  # files of 100,001 values, seconds each: left out by make test-fast
@pytest.mark.parametrize(
    "text",
    [
        "".join(f"- a{i}\n" for i in range(MAX_EXPANDED_NODES + 1)),
        "[" + ",".join("1" for _ in range(MAX_EXPANDED_NODES + 1)) + "]",
        "".join(f"k{i}: v\n" for i in range(MAX_EXPANDED_NODES // 2 + 1)),
    ],
    ids=["block-list", "flow-list", "mapping"],
)
def test_a_file_of_too_many_values_is_refused_while_it_is_composed(text: str) -> None:
    """Under the byte bound but past the value bound: refused when the parser reaches the bound,
    before the rest is composed (memory stays at the bound's, not the file's)."""
    assert len(text) < MAX_DOCUMENT_BYTES
    with pytest.raises(DocumentError, match=f"more than {MAX_EXPANDED_NODES:,} values"):
        load_documents(text)


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


def test_deep_block_nesting_is_refused_in_one_line() -> None:
    text = "".join("  " * i + f"k{i}:\n" for i in range(2000)) + "  " * 2000 + "v\n"
    with pytest.raises(DocumentError, match="nested deeper than") as caught:
        load_documents(text)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a: 1\nb: 2\na: 3\n", "line 3"),
        ('{"a": 1, "a": 2}', "line 1"),
        ("x:\n  - {k: 1, k: 1}\n", "line 2"),
        ("1: a\n1: b\n", "line 2"),
        ("a: 1\n'a': 2\n", "line 2"),  # quoted or not, one key
        ('spec:\n  sender:\n    mllp: {host: a, "host": b}\n', "line 3"),
        ("---\nx: 1\n---\ny: 1\ny: 2\n", "line 5"),  # in the second document
    ],
)
def test_a_key_given_twice_is_refused(text: str, line: str) -> None:
    with pytest.raises(DocumentError, match=f"{line}: key .* given twice"):
        load_documents(text)


def test_merge_keys_still_override() -> None:
    [doc] = load_documents("base: &b {x: 1, y: 2}\nthis:\n  <<: *b\n  y: 3\n")
    assert doc["this"] == {"x": 1, "y": 3}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"why": "a", "why": "b"}', "key 'why' given twice"),
        ("[" * 10_000 + "]" * 10_000, "nested deeper than"),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested deeper than"),
        ("[" + ",".join("1" for _ in range(MAX_EXPANDED_NODES + 1)) + "]", "more than"),
        ('{"a": ', "line 1 column 7"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b" " * (MAX_DOCUMENT_BYTES + 1), "larger than 4 MiB"),
    ],
    ids=["duplicate", "deep", "just-too-deep", "too-many", "truncated", "not-utf8", "too-big"],
)
def test_json_is_read_with_the_same_bounds(text: str | bytes, says: str) -> None:
    with pytest.raises(DocumentError, match=says) as caught:
        load_json(text)
    assert "\n" not in str(caught.value)


def test_json_within_the_bounds_is_read_as_json() -> None:
    assert load_json('{"n": 1e3, "s": "a\\/b", "l": [null, true]}') == {
        "n": 1000.0,
        "s": "a/b",
        "l": [None, True],
    }


def test_an_already_parsed_object_is_checked_without_recursion() -> None:
    deep: dict[str, object] = {}
    cur = deep
    for _ in range(100_000):  # far past the interpreter's recursion limit
        cur["x"] = {}
        cur = cur["x"]  # type: ignore[assignment]
    with pytest.raises(DocumentError, match="nested deeper"):
        check_shape(deep)
    with pytest.raises(DocumentError, match="more than"):
        check_shape({"a": ["x"] * (MAX_EXPANDED_NODES + 1)})
    check_shape({"a": [{"b": 1}] * 1000})


def test_the_operators_reading_path_refuses_a_deep_or_huge_destination() -> None:
    """The operator renders the Destination the API server stored (already parsed JSON): a spec
    nested 10,000 deep, or of a million values, is an invalid spec in one line, not a
    RecursionError in the reconcile."""
    from inturn.operator.manifests import WorkerPodSettings, render

    def body(extra: object) -> dict[str, object]:
        return {
            "metadata": {"name": "a", "namespace": "ns", "uid": "u"},
            "spec": {
                "channel": "adt",
                "retry": {"maxAttempts": 0},
                "sender": {"mllp": {"host": "h", "port": 1, "extra": extra}},
            },
        }

    deep: dict[str, object] = {}
    cur = deep
    for _ in range(10_000):
        cur["x"] = {}
        cur = cur["x"]  # type: ignore[assignment]
    for extra, says in ((deep, "nested deeper than"), (["v"] * 1_000_000, "more than")):
        with pytest.raises(ManifestError, match=says) as caught:
            render(body(extra), WorkerPodSettings(image="x"))
        assert "\n" not in str(caught.value)


def test_a_file_past_the_byte_bound_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with path.open("wb") as f:
        f.write(b"# " + b"x" * (MAX_DOCUMENT_BYTES + 10) + b"\n")
    with pytest.raises(ManifestError, match="larger than 4 MiB"):
        load_file(path)


def test_every_reader_uses_the_bounds(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    bomb.chmod(0o600)  # credentials and console users are key files too
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
    if name == "fifty-mb":
        with path.open("wb") as f:
            line = b"# " + b"x" * 1022 + b"\n"
            for _ in range(50 * 1024):
                f.write(line)
    elif text is None:
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


@pytest.mark.slow  # whole inturn processes on hostile files: left out by make test-fast
@pytest.mark.parametrize(
    "name",
    [
        "alias-bomb",
        "merge-bomb",
        "many-values",
        "deep-flow",
        "duplicate-key",
        "not-utf8",
        "fifty-mb",
    ],
)
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


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b'[{"locator": "A", "locator": "B"}]', "given twice"),
        (b"[" * 10_000 + b"]" * 10_000, "nested deeper than"),
        (b"[" + b",".join(b"1" for _ in range(MAX_EXPANDED_NODES + 1)) + b"]", "more than"),
        (b" " * (MAX_DOCUMENT_BYTES + 1), "larger than 4 MiB"),
        (None, "No such file"),
    ],
    ids=["duplicate", "deep", "many-values", "too-big", "missing"],
)
def test_a_hostile_bookings_file_is_refused_in_one_line(
    tmp_path: Path, content: bytes | None, says: str
) -> None:
    path = tmp_path / "bookings.json"
    if content is not None:
        path.write_bytes(content)
    done = _run(
        "bookings", "import", "--dsn", "postgresql://127.0.0.1:9/x", str(path), cwd=tmp_path
    )
    assert done.returncode in (1, 2), done.stderr
    err = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and says in err[0] and "nothing imported" in err[0], done.stderr
