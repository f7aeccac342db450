"""``spec.profile`` as the API declares it: the CRD's node with the issue's names, a manifest's
profile compiled into the worker's configuration and back, every problem by field path, and
``inturn validate --preview``."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from inturn.worker.hl7.profile import compile_profile
from inturn.worker.spec import schema
from inturn.worker.spec.destination import (
    ManifestError,
    load_manifest,
    load_worker_config,
    render_worker_config,
)
from tests.support.cli import inturn

ROOT = Path(__file__).resolve().parents[2]

#: The issue's example, word for word.
PROFILE = yaml.safe_load(
    """
set: {MSH-5: LIS_NORTH, MSH-6: NORTH, MSH-11: P}
copy: {MSH-3: MSH-4}
removeSegments: ["Z*", NTE]
clear: [PID-19, PID-13]
truncate: {OBX-5: 200}
charset: {to: UTF-8, unmappable: refuse}
sequenceNumbers: true
maps:
  - {field: OBX-3.1, table: {GLU: "2345-7"}, otherwise: keep}
"""
)

BASE: dict[str, Any] = {
    "apiVersion": "inturn.dev/v1alpha1",
    "kind": "Destination",
    "metadata": {"name": "lis-north", "namespace": "lab"},
    "spec": {
        "channel": "results",
        "sender": {"mllp": {"host": "lis.north.example", "port": 2575}},
        "retry": {"maxAttempts": 5},
    },
}


def manifest(profile: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"]["profile"] = profile
    return doc


def test_the_crd_declares_the_issues_names() -> None:
    crd = yaml.safe_load((ROOT / schema.CRD_PATH).read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    node = spec["properties"]["profile"]["properties"]
    assert set(node) == {
        "set",
        "copy",
        "removeSegments",
        "clear",
        "truncate",
        "charset",
        "sequenceNumbers",
        "maps",
    }
    assert set(node["charset"]["properties"]) == {"to", "unmappable", "whenUndeclared"}
    assert node["charset"]["properties"]["unmappable"]["enum"] == [
        "refuse",
        "replace",
        "transliterate",
    ]
    assert {"UTF-8", "ASCII", "ISO-8859-1", "ISO-8859-15"} <= set(
        node["charset"]["properties"]["to"]["enum"]
    )
    item = node["maps"]["items"]["properties"]
    assert set(item) == {"field", "table", "otherwise"}
    assert item["otherwise"]["enum"] == ["keep", "clear", "hold"]
    worker = schema.worker_config_schema()["properties"]
    assert worker["profile"] == spec["properties"]["profile"]


def test_a_manifests_profile_reaches_the_worker_and_back() -> None:
    cfg = load_manifest(manifest(PROFILE))
    expected = compile_profile({**PROFILE, "charset": {**PROFILE["charset"]}})
    assert cfg.profile == expected
    rendered = render_worker_config(cfg)
    assert rendered["profile"]["charset"] == {
        "to": "UTF-8",
        "unmappable": "refuse",
        "whenUndeclared": "ASCII",
    }
    assert load_worker_config(rendered) == cfg
    assert load_manifest(BASE).profile is None
    assert load_manifest(manifest({"sequenceNumbers": False})).profile is None


def test_every_problem_by_field_path() -> None:
    with pytest.raises(ManifestError) as error:
        load_manifest(
            manifest(
                {
                    "set": {"MSH-10": "X", "msh-5": "x", "MSH-4": "a\rb"},
                    "copy": {"MSH-6": "nonsense"},
                    "clear": ["PID-3"],
                    "truncate": {"OBX-5": 0},
                    "removeSegments": ["M*", "Z*"],
                    "charset": {"to": "EBCDIC"},
                    "maps": [{"field": "OBX-3.1", "table": {"A": "B"}, "otherwise": "drop"}],
                    "sequenceNumbers": True,
                    "shape": 1,
                }
            )
        )
    assert list(error.value.errors) == [
        "spec.profile.charset.to: must be one of " + ", ".join(schema_targets()),
        "spec.profile.clear: MSH-1 and MSH-2 (the delimiters), MSH-10 (the receiver's ACK names"
        " it) and PID-3 (the patient) may not be changed by a profile",
        "spec.profile.copy.MSH-6: 'nonsense' does not match"
        " ^[A-Z][A-Z0-9]{2}-[1-9][0-9]{0,2}([.][1-9][0-9]{0,2}){0,2}$",
        "spec.profile.copy.MSH-6: 'nonsense' is not a field reference such as MSH-5, PID-13 or"
        " OBX-3.1",
        "spec.profile.maps[0].otherwise: must be one of keep, clear, hold",
        "spec.profile.removeSegments[0]: 'M*' would remove MSH (the header and the patient stay)",
        "spec.profile.set.MSH-10: MSH-10 is the control ID the receiver's ACK names; a profile"
        " may not change it",
        "spec.profile.set.MSH-4: must not contain control characters (CR, LF, TAB, NUL, ...)",
        "spec.profile.set.msh-5: 'msh-5' is not a field reference such as MSH-5, PID-13 or OBX-3.1",
        "spec.profile.shape: unknown field",
        "spec.profile.truncate.OBX-5: must be >= 1",
    ]


def schema_targets() -> list[str]:
    node = schema.spec_schema()["properties"]["profile"]["properties"]["charset"]
    return list(node["properties"]["to"]["enum"])


def validate(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``inturn validate <args>`` from ``cwd`` without any ``INTURN_*`` setting, run in this
    process (tests/support/cli.py)."""
    return inturn("validate", *args, cwd=cwd)


MESSAGE = (
    b"MSH|^~\\&|LAB|SOUTH|LIS|X|20260101||ORU^R01|C1|P|2.5.1\r"
    b"PID|1||123^^^H||Doe^J\xc3\xa9r\xc3\xb4me||19800101|F|||||555-0100||||||SSN\r"
    b"OBX|1|NM|GLU^Glucose||98||||||F\r"
    b"NTE|1||a note\r"
    b"ZXY|1|local\r"
)


def test_validate_preview_prints_what_the_receiver_gets(tmp_path: Path) -> None:
    profile = {**PROFILE, "charset": {"to": "ISO-8859-1", "whenUndeclared": "UTF-8"}}
    (tmp_path / "lis.yaml").write_text(yaml.safe_dump(manifest(profile)))
    plain = copy.deepcopy(BASE)
    plain["metadata"]["name"] = "archive"
    (tmp_path / "archive.yaml").write_text(yaml.safe_dump(plain))
    (tmp_path / "m.hl7").write_bytes(MESSAGE)
    run = validate("--preview", "m.hl7", "lis.yaml", "archive.yaml", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == [
        "2 document(s) in 2 file(s): valid",
        f"lab/archive: as stored (no profile), {len(MESSAGE)} bytes ({len(MESSAGE)} stored):",
        "  MSH|^~\\&|LAB|SOUTH|LIS|X|20260101||ORU^R01|C1|P|2.5.1",
        "  PID|1||123^^^H||Doe^Jérôme||19800101|F|||||555-0100||||||SSN",
        "  OBX|1|NM|GLU^Glucose||98||||||F",
        "  NTE|1||a note",
        "  ZXY|1|local",
        f"lab/lis-north: as sent, 164 bytes ({len(MESSAGE)} stored):",
        "  MSH|^~\\&|SOUTH|SOUTH|LIS_NORTH|NORTH|20260101||ORU^R01|C1|P|2.5.1|1|||||8859/1",
        "  PID|1||123^^^H||Doe^Jérôme||19800101|F|||||||||||",
        "  OBX|1|NM|2345-7^Glucose||98||||||F",
    ]


def test_validate_preview_says_why_a_profile_refuses(tmp_path: Path) -> None:
    (tmp_path / "lis.yaml").write_text(yaml.safe_dump(manifest({"charset": {"to": "ASCII"}})))
    (tmp_path / "m.hl7").write_bytes(MESSAGE)
    run = validate("--preview", "m.hl7", "lis.yaml", cwd=tmp_path)
    assert run.returncode == 1
    assert run.stdout.splitlines()[-1] == (
        "lab/lis-north: refused: PID-5 '0xC3': does not decode as ASCII (MSH-18 is empty):"
        " charset.whenUndeclared names the character set of a message without MSH-18"
        " (refused whatever unmappable says)"
    )
