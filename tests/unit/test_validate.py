"""``inturn validate``: every problem of Destination manifests, feeds files and channel
declarations, by file, document and field path, offline; its exit statuses."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from inturn.worker.spec.channels import CHANNEL_SCHEMA, parse_channels
from tests.support.cli import inturn

ROOT = Path(__file__).resolve().parents[2]

LIS_NORTH = """\
apiVersion: inturn.dev/v1alpha1
kind: Destination
metadata: {name: lis-north, namespace: lab}
spec:
  channel: lab
  sender: {mllp: {host: lis-north, port: 2575}}
  retry: {maxAttempts: 0}
  carriers: [LH]
  filter:
    messageTypes: [ORU^R01]
    fields:
      - {field: MSH-4, operator: In, values: [NORTH]}
"""

BROKEN = """\
apiVersion: inturn.dev/v1alpha1
kind: Destination
metadata: {name: Bad}
spec:
  channel: adt
  sender: {mllp: {host: lis, port: 99999}}
  retry: {maxAttemps: 0}
"""

BAD_FILTER = """\
apiVersion: inturn.dev/v1alpha1
kind: Destination
metadata: {name: bed-board}
spec:
  channel: adt
  sender: {mllp: {host: bb, port: 2575}}
  retry: {maxAttempts: 0}
  carriers: [LH]
  filter:
    fields:
      - {field: PV1-3, operator: In}
      - {field: MSH-2, operator: Exists}
"""


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``inturn validate <args>`` from ``cwd`` without any ``INTURN_*`` setting, run in this
    process (tests/support/cli.py: these tests are about what it says, not a process start)."""
    return inturn("validate", *args, cwd=cwd)


def test_valid_files_exit_zero(tmp_path: Path) -> None:
    (tmp_path / "lis.yaml").write_text(LIS_NORTH)
    (tmp_path / "decl.yaml").write_text(
        "channels:\n  - {name: lab, port: 2576}\n"
        "feeds:\n  - {channel: lab, silentAfterSeconds: 600}\n"
    )
    done = run("lis.yaml", "decl.yaml", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "2 document(s) in 2 file(s): valid\n")


def test_every_problem_is_reported_with_file_document_and_path(tmp_path: Path) -> None:
    (tmp_path / "dest.yaml").write_text(
        f"{LIS_NORTH}---\n{LIS_NORTH}---\n{BROKEN}---\n{BAD_FILTER}"
    )
    (tmp_path / "values.yaml").write_text(
        yaml.safe_dump(
            {
                "ingest": {
                    "channels": [
                        {"name": "adt", "port": 2575},
                        {"name": "lab", "port": 2575},
                        {"name": "rad", "port": 2577, "allowedNetworks": ["everyone"]},
                    ],
                    "feeds": [{"channel": "adt", "silentAfterSeconds": 10}],
                }
            }
        )
    )
    (tmp_path / "worker.json").write_text(json.dumps({"destination": "a/b", "channel": "x"}))
    (tmp_path / "odd.yaml").write_text("kind: Service\n---\n- a list\n")
    done = run("dest.yaml", "values.yaml", "worker.json", "odd.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "dest.yaml#2: metadata.name: lab/lis-north is declared twice (also dest.yaml#1)",
        "dest.yaml#3: metadata.name: 'Bad' does not match ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        "dest.yaml#3: spec.retry.maxAttemps: unknown field",
        "dest.yaml#3: spec.retry.maxAttempts: required",
        "dest.yaml#3: spec.sender.mllp.port: must be <= 65535",
        "dest.yaml#4: spec.filter.fields[0].values: In, NotIn, Matches and NotMatches need at"
        " least one value",
        "dest.yaml#4: spec.filter.fields[1].field: MSH-1 and MSH-2 are the delimiters; filters"
        " read MSH-3 and later",
        "values.yaml#1: ingest.channels[2].allowedNetworks[0]: 'everyone' does not match"
        " '^[0-9a-fA-F:.]+/[0-9]{1,3}$'",
        "values.yaml#1: ingest.channels[1].port: 2575 is used twice (also ingest.channels[0])",
        "values.yaml#1: ingest.feeds[0].silentAfterSeconds: 10 is less than the minimum of 60",
        "worker.json#1: retry: required",
        "worker.json#1: sender: required",
        "odd.yaml#1: kind: must be Destination or WorkerConfig, not 'Service' (or a file of"
        " feeds or channels, or the chart's values)",
        "odd.yaml#2: <root>: must be a mapping",
        "8 document(s) in 4 file(s): 14 problem(s)",
    ]


def test_cross_document_checks(tmp_path: Path) -> None:
    fixed = BAD_FILTER.replace("operator: In}", "operator: In, values: [4W]}").replace(
        "      - {field: MSH-2, operator: Exists}\n", ""
    )
    (tmp_path / "a.yaml").write_text(LIS_NORTH)
    (tmp_path / "b.yaml").write_text(fixed)
    (tmp_path / "c.yaml").write_text(
        "channels:\n  - {name: adt, port: 2575}\n  - {name: adt, port: 2576}\n"
        "feeds:\n  - {channel: rad, silentAfterSeconds: 600}\n"
    )
    done = run("a.yaml", "b.yaml", "c.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "b.yaml#1: spec.carriers: LH is already served by lab/lis-north (a.yaml#1)",
        "c.yaml#1: channels[1].name: adt is declared twice (also channels[0])",
        "warning: a.yaml#1: spec.channel: lab/lis-north takes channel lab, which no channel"
        " declaration names (declared: adt); only HTTP ingest can feed it",
        "warning: c.yaml#1: feeds[0].channel: rad is not a declared channel (declared: adt);"
        " only HTTP ingest can feed it",
        "3 document(s) in 3 file(s): 2 problem(s)",
    ]


def test_unreadable_files_and_yaml(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("spec: [unclosed\n")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe")
    (tmp_path / "ok.yaml").write_text(LIS_NORTH)
    (tmp_path / "broken.yaml").write_text(BROKEN)
    done = run("bad.yaml", "bin.yaml", "ok.yaml", "broken.yaml", cwd=tmp_path)
    # unreadable files exit 2 (as the reference says), and the others are still checked
    assert done.returncode == 2
    lines = done.stdout.splitlines()
    assert lines[:2] == [
        "bad.yaml: unreadable: line 2: not valid YAML (expected ',' or ']', but got"
        " '<stream end>')",
        "bin.yaml: unreadable: byte 0: not UTF-8 text",
    ]
    assert any(line.startswith("broken.yaml#1: ") for line in lines)
    assert lines[-1] == (
        f"2 document(s) in 4 file(s): {len(lines) - 1} problem(s), 2 file(s) unreadable"
    )


def test_an_empty_file_is_no_documents(tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "comments.yaml").write_text("# nothing yet\n---\n")
    done = run("empty.yaml", "comments.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "empty.yaml: no documents (the file is empty or holds only comments)",
        "comments.yaml: no documents (the file is empty or holds only comments)",
        "0 document(s) in 2 file(s): 2 problem(s)",
    ]


def test_a_folder_is_read_as_inturn_local_reads_it(tmp_path: Path) -> None:
    (tmp_path / "manifests" / "lab").mkdir(parents=True)
    (tmp_path / "manifests" / "lis.yaml").write_text(LIS_NORTH)
    (tmp_path / "manifests" / "lab" / "bad.yml").write_text(BROKEN)
    (tmp_path / "manifests" / "README.md").write_text("not a manifest")
    (tmp_path / "nothing").mkdir()
    done = run("manifests", cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert {line.split(": ", 1)[0] for line in lines[:-1]} == {"manifests/lab/bad.yml#1"}
    assert lines[-1].startswith("2 document(s) in 2 file(s): ")
    empty = run("nothing", cwd=tmp_path)
    assert (empty.returncode, empty.stdout.splitlines()[0]) == (
        1,
        "nothing: no documents (no *.yaml, *.yml, *.json file under this folder)",
    )


def test_cross_field_rules_are_reported_with_the_type_errors(tmp_path: Path) -> None:
    """One pass: the rules that tie fields together are checked on the parts that are well
    typed, beside the type errors of other parts (they used to appear only once those were
    fixed)."""
    (tmp_path / "two.yaml").write_text(
        "apiVersion: inturn.dev/v1alpha1\nkind: Destination\nmetadata: {name: lis}\n"
        "spec:\n  channel: adt\n  sender: {}\n  retry: {maxAttempts: lots}\n"
    )
    done = run("two.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "two.yaml#1: spec.retry.maxAttempts: must be an integer",
        "two.yaml#1: spec.sender: exactly one of mllp, http, sftp must be set",
        "1 document(s) in 1 file(s): 2 problem(s)",
    ]


def test_usage_errors_exit_two(tmp_path: Path) -> None:
    missing = run("missing.yaml", cwd=tmp_path)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    none = run(cwd=tmp_path)
    assert none.returncode == 2 and "Missing argument 'FILE|DIR...'" in none.stderr


@pytest.mark.parametrize("path", sorted((ROOT / "examples").rglob("*.yaml")), ids=lambda p: p.name)
def test_the_examples_are_valid(path: Path) -> None:
    done = run(path, cwd=ROOT)
    assert done.returncode == 0, done.stdout


def test_the_chart_values_are_valid() -> None:
    done = run(ROOT / "charts/inturn/values.yaml", cwd=ROOT)
    assert done.returncode == 0, done.stdout


def test_the_channel_schema_is_the_charts() -> None:
    values = json.loads((ROOT / "charts/inturn/values.schema.json").read_text())
    chart = values["properties"]["ingest"]["properties"]["channels"]["items"]
    assert chart == CHANNEL_SCHEMA


def test_parse_channels() -> None:
    [adt] = parse_channels([{"name": "adt", "port": 2575, "allowedNetworks": ["10.0.0.0/8"]}])
    assert (adt.name, adt.port, adt.allowed_networks, adt.unrouted) == (
        "adt",
        2575,
        ("10.0.0.0/8",),
        "reject",
    )
    with pytest.raises(ValueError, match=r"channels\[1\].port: 2575 is used twice"):
        parse_channels([{"name": "adt", "port": 2575}, {"name": "lab", "port": 2575}])


ONE_PASS = """\
apiVersion: inturn.dev/v1alpha1
kind: Destination
metadata: {name: lab, namespace: ward}
spec:
  channel: 123
  retry: {maxAttempts: 0, backoffSeconds: 100, maxBackoffSeconds: 10}
  lanes: {count: 4}
  sender: {sftp: {host: h, username: u, directory: d, knownHostsSecretRef: {name: x}}}
---
apiVersion: inturn.dev/v1alpha1
kind: Destination
metadata: {name: lab, namespace: ward}
spec:
  channel: adt
  retry: {maxAttempts: "x"}
  sender: {mllp: {host: h, port: 2575}}
"""


def test_every_problem_in_one_pass(tmp_path: Path) -> None:
    """Types, cross-field rules beside a mistyped field, an object-level rule and a name given
    twice: all in one run (issue 39: five problems took three runs)."""
    (tmp_path / "two.yaml").write_text(ONE_PASS)
    done = run("two.yaml", cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert "two.yaml#1: spec.channel: must be a string" in lines
    assert any(
        line.startswith("two.yaml#1: spec.lanes.count: sftp takes one lane") for line in lines
    )
    assert (
        "two.yaml#1: spec.retry: maxBackoffSeconds must be greater than or equal to backoffSeconds"
        in lines
    )
    assert "two.yaml#1: spec.sender.sftp.secretRef: required" in lines
    assert "two.yaml#2: spec.retry.maxAttempts: must be an integer" in lines
    assert "two.yaml#2: metadata.name: ward/lab is declared twice (also two.yaml#1)" in lines
