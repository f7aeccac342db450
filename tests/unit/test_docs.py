"""The README and the documentation site say only what the code does.

Every YAML and JSON example in ``docs/`` and the README is validated by the parser that reads
that kind of file (a Destination by the CRD schema, an ingest credentials file, a console auth
file, chart values by ``values.schema.json``, a bookings import). Every shell example is checked
command by command: ``inturn`` commands must parse with the real click commands (every
subcommand, option and required argument), ``helm --set`` keys must be chart values,
``kubectl apply -f`` files must exist and validate, ``make`` targets must exist, and every
repository path an example names must exist. The tutorial's commands also run for real in
``tests/acceptance/test_tutorial.py``.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import jsonschema
import pytest
import yaml

from inturn.worker.cli import cli
from inturn.worker.console.auth import parse_auth
from inturn.worker.feeds.declare import parse_feeds
from inturn.worker.ingest.credentials import Credentials
from inturn.worker.reservations.records import parse_bookings
from inturn.worker.spec.channels import parse_channels
from inturn.worker.spec.destination import load_manifest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
CHART = ROOT / "charts" / "inturn"

sys.path.insert(0, str(DOCS / "_ext"))
import inturn_reference  # noqa: E402  (docs/_ext is not a package)

FENCE = re.compile(r"^```(?P<lang>[a-z]*)[^\n]*\n(?P<body>.*?)^```\s*$", re.M | re.S)


def pages() -> list[Path]:
    """The README and every Markdown page of the documentation."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def blocks(lang: str) -> Iterator[tuple[str, str]]:
    """(where, text) of every fenced block of a language, over every page."""
    for page in pages():
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match["lang"] == lang:
                line = text.count("\n", 0, match.start()) + 1
                yield f"{page.relative_to(ROOT)}:{line}", match["body"]


def _ids(items: list[tuple[str, str]]) -> list[str]:
    return [where for where, _ in items]


YAML = list(blocks("yaml"))
JSON = list(blocks("json"))
SHELL = list(blocks("sh"))


def test_readme_fits_two_screens_and_starts_with_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 100
    first = FENCE.search(text)
    assert first is not None and first["lang"] == "sh"
    assert [line.split()[:2] for line in first["body"].splitlines()] == [
        ["make", "demo"],
        ["make", "test"],
    ]


def test_every_page_is_in_a_toctree() -> None:
    """Sphinx warns on orphans too; this says which page, without building."""
    named = set()
    for page in DOCS.rglob("*.md"):
        for block in re.findall(r"```\{toctree\}\n(.*?)```", page.read_text(), re.S):
            for line in block.splitlines():
                if line and not line.startswith(":"):
                    named.add((page.parent / line.strip()).resolve())
    missing = [
        str(p.relative_to(DOCS))
        for p in DOCS.rglob("*.md")
        if p.with_suffix("").resolve() not in named and p != DOCS / "index.md"
    ]
    assert missing == []


def test_the_destination_field_by_field_is_a_valid_manifest() -> None:
    text = (DOCS / "reference" / "destination.md").read_text()
    start = text.index("```yaml", text.index("## A Destination, field by field")) + len("```yaml")
    doc = yaml.safe_load(text[start : text.index("```", start)])
    cfg = load_manifest(doc, secrets_dir="/nonexistent")
    assert cfg.destination == "hospital/lab-results"
    assert (cfg.retry.max_attempts, cfg.ack_policy.AR, cfg.message_types) == (
        20,
        "fail",
        ("ORU^R01", "ORM^*"),
    )


def _chart_values_schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def _sender_fragment(doc: dict[str, Any]) -> dict[str, Any]:
    """A ``sender:`` fragment made into a whole Destination."""
    return {
        "apiVersion": "inturn.dev/v1alpha1",
        "kind": "Destination",
        "metadata": {"name": "fragment", "namespace": "docs"},
        "spec": {"channel": "adt", "retry": {"maxAttempts": 0}, **doc},
    }


def validate_yaml(doc: Any) -> str:
    """Validate one YAML example by what it is; return its kind. Raises on an invalid one."""
    assert isinstance(doc, dict), "a YAML example is a mapping"
    if doc.get("kind") == "Destination":
        load_manifest(doc, secrets_dir="/nonexistent")
        return "Destination"
    if set(doc) == {"sender"}:
        load_manifest(_sender_fragment(doc), secrets_dir="/nonexistent")
        return "sender"
    if "credentials" in doc:
        Credentials.from_data(doc)
        return "ingest credentials"
    if set(doc) <= {"tokens", "proxy"}:
        parse_auth(doc)
        return "console auth"
    if set(doc) == {"feeds"}:
        parse_feeds(doc)
        return "feed declarations"
    if "channels" in doc and set(doc) <= {"feeds", "channels"}:
        parse_channels(doc["channels"])
        if "feeds" in doc:
            parse_feeds({"feeds": doc["feeds"]})
        return "channel declarations"
    if str(doc.get("apiVersion", "")).startswith("postgresql.cnpg.io/"):
        # CloudNativePG's own resources (no schema here): the fields inturn's recipe relies on
        assert doc["kind"] == "Pooler", doc.get("kind")
        spec = doc["spec"]
        assert spec["cluster"]["name"] and spec["type"] in {"rw", "ro"}
        assert spec["pgbouncer"]["poolMode"] in {"session", "transaction"}
        return "CloudNativePG Pooler"
    if doc.get("kind") in {"Application", "HelmRelease"}:
        values = doc["spec"].get("values") or doc["spec"]["source"]["helm"]["valuesObject"]
        jsonschema.validate(values, _chart_values_schema())
        return "chart values"
    jsonschema.validate(doc, _chart_values_schema())
    return "chart values"


@pytest.mark.parametrize("where,text", YAML, ids=_ids(YAML))
def test_yaml_example_is_valid(where: str, text: str) -> None:
    for doc in yaml.safe_load_all(text):
        validate_yaml(doc)


@pytest.mark.parametrize("where,text", JSON, ids=_ids(JSON))
def test_json_example_is_valid(where: str, text: str) -> None:
    doc = json.loads(text)
    assert isinstance(doc, list), "the JSON examples are bookings imports"
    assert parse_bookings(doc)


def commands(text: str) -> Iterator[list[str]]:
    """The commands of a shell block: continuations joined, comments dropped, split on
    ``&&``, ``;``, ``|`` and a trailing ``&``."""
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in [*words, ";"]:
            if word in {"&&", ";", "|", "&", "||"}:
                if command:
                    yield command
                command = []
            else:
                command.append(word)


def _strip_env(words: list[str]) -> list[str]:
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words = words[1:]
    return words


def check_inturn(args: list[str]) -> None:
    """Parse an ``inturn`` command line with the real commands, without running it."""
    command: click.Command = cli
    ctx = cli.make_context("inturn", list(args), resilient_parsing=False)
    rest = [*ctx._protected_args, *ctx.args]
    while isinstance(command, click.Group) and rest:
        name, rest = rest[0], rest[1:]
        sub = command.get_command(ctx, name)
        assert sub is not None, f"no command {ctx.command_path} {name}"
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub
        rest = (
            [*getattr(ctx, "_protected_args", []), *ctx.args]
            if isinstance(sub, click.Group)
            else []
        )


def _values_paths() -> set[str]:
    return {row.path.replace("[]", "") for row in inturn_reference.chart_value_rows(ROOT)}


def check_command(words: list[str]) -> None:
    """Check one command of a shell example (see the module docstring)."""
    words = _strip_env(words)
    if not words:
        return
    program = words[0].removeprefix(".venv/bin/")
    for word in words[1:]:
        path = word.split("=", 1)[-1]
        looks_like_file = path.endswith("/") or re.search(r"\.[a-z]+$", path)
        if looks_like_file and re.match(r"^(examples|charts|crds|deploy|docs|worker|tests)/", path):
            assert (ROOT / path.rstrip("/")).exists() or "*" in path, f"no such path {path}"
    if program == "inturn":
        check_inturn(words[1:])
    elif program == "make":
        makefile = (ROOT / "Makefile").read_text()
        for target in words[1:]:
            if "=" not in target:
                assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"no target {target}"
    elif program == "helm" and words[1:2] in (["install"], ["upgrade"]):
        paths = _values_paths()
        for i, word in enumerate(words):
            if word == "--set":
                key = words[i + 1].split("=", 1)[0]
                assert re.sub(r"\[\d+\]", "", key) in paths, f"no chart value {key}"
    elif program == "kubectl" and words[1:2] == ["apply"]:
        for i, word in enumerate(words):
            if word == "-f" and words[i + 1].endswith((".yaml", ".yml")):
                for doc in yaml.safe_load_all((ROOT / words[i + 1]).read_text()):
                    validate_yaml(doc)


@pytest.mark.parametrize("where,text", SHELL, ids=_ids(SHELL))
def test_shell_example_is_valid(where: str, text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the examples run from a clone's root (tests run elsewhere)
    for words in commands(text):
        check_command(words)


def test_the_checks_see_the_examples() -> None:
    """The examples are found at all (a changed fence would silently check nothing)."""
    assert len(YAML) >= 4 and len(SHELL) >= 10 and JSON


def test_generated_reference_rows() -> None:
    """The generated tables hold what they should (the directives render these rows)."""
    dest = {r.path: r for r in inturn_reference.destination_rows()}
    assert dest["spec.retry.maxAttempts"].kind.endswith("required")
    assert "spec.sender.mllp.host" in dest and "status.oldestPendingTime" in dest
    values = {r.path: r for r in inturn_reference.chart_value_rows(ROOT)}
    assert values["image.repository"].default == '""'
    assert values["operator.metricsPort"].default == "9090"
    assert "metrics" in values["operator.metricsPort"].description.lower()
    metrics = {m.name: m for m in inturn_reference.metric_rows()}
    assert metrics["inturn_delivered_total"].labels == ("destination",)
    assert metrics["inturn_queue_oldest_age_seconds"].kind == "gauge"
    assert "inturn_operator_reconcile_errors_total" in metrics


@pytest.mark.parametrize(
    "line",
    [
        "inturn queue resend 1 --who a --no-such-option",
        "inturn no-such-command",
        "inturn queue skip 1",  # --who is required
        ".venv/bin/inturn local -f examples/no-such-file.yaml --listen adt=2575",
        "make no-such-target",
        "helm install inturn charts/inturn --set image.no_such_key=1",
    ],
)
def test_the_shell_checks_catch_a_wrong_example(line: str) -> None:
    with pytest.raises((AssertionError, click.ClickException)):
        for words in commands(line):
            check_command(words)


def test_the_yaml_checks_catch_a_wrong_example() -> None:
    with pytest.raises(Exception, match=r"maxAttempts|retry"):
        validate_yaml(
            {
                "apiVersion": "inturn.dev/v1alpha1",
                "kind": "Destination",
                "metadata": {"name": "x", "namespace": "y"},
                "spec": {"channel": "adt", "sender": {"mllp": {"host": "h", "port": 1}}},
            }
        )
    with pytest.raises(jsonschema.ValidationError):
        validate_yaml({"image": {"repositry": "typo"}})


def test_the_metrics_page_names_every_failure_cause() -> None:
    """The ``cause`` label of the retry and give-up counters takes every failure cause a sender
    can report; the metrics page lists them all (a new user saw ``profile`` and ``unreachable``
    series the page did not name)."""
    from typing import get_args

    from inturn.worker.senders.base import FailureCause

    page = (Path(__file__).resolve().parents[2] / "docs/reference/metrics.md").read_text()
    line = page[page.index("`inturn_retries_total` and `inturn_gave_up_total`") :]
    listed = line[: line.index("(")].replace("\n", " ")
    missing = [
        c for c in get_args(FailureCause) if f" {c}," not in listed and f" {c} " not in listed
    ]
    assert missing == []
