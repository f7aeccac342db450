"""Rules every migration keeps so that it can run under live workers (an upgrade in place)."""

from __future__ import annotations

import re
from pathlib import Path

MIGRATIONS = Path(__file__).resolve().parents[2] / "worker" / "store" / "migrations"


def test_no_migration_drops_or_renames_a_function() -> None:
    """A function the per-message statements name is never dropped, renamed or made again in
    its place: a running worker's session has prepared those statements, and a plan naming a
    function that is gone failed its statement at every try ("cache lookup failed for
    function", until the session ended: migration 0057's first form under traffic, clean-clone
    CI of 846f1e0). A function whose return type must change is made beside the old one under
    a new name, and the statements move to it (inturn_log_payload_rows); ``CREATE OR REPLACE``
    of the same signature keeps the function and its plans valid."""
    files = sorted(MIGRATIONS.glob("*.sql"))
    assert len(files) >= 50
    offenders = []
    for path in files:
        text = re.sub(r"--[^\n]*", "", path.read_text())
        if re.search(r"(?i)\bDROP\s+(FUNCTION|PROCEDURE|ROUTINE)\b", text):
            offenders.append(f"{path.name}: DROP")
        if re.search(r"(?i)\bALTER\s+(FUNCTION|PROCEDURE|ROUTINE)\b[^;]*\bRENAME\b", text):
            offenders.append(f"{path.name}: RENAME")
    assert offenders == []
