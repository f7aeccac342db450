"""A message naming more patient identifiers than ingest indexes (``--max-indexed-identifiers``,
100 by default), stored by a real ingest: every lookup by patient (``queue list --patient-id``,
``queue erase --patient-id`` with and without ``--dry-run`` and ``--scan``) finds it by its 1st,
100th, 101st and 150th identifier; the cut rows are found through the identifier index."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from inturn.worker.cli import main
from inturn.worker.crypto import envelope
from inturn.worker.hl7.pid import CAPPED_KEY, lookup_key
from inturn.worker.ingest.service import Ingest
from inturn.worker.store import identifiers, reads
from tests.support import keys
from tests.support.ingest import Client, config, msg, rows
from tests.support.pipeline import register

pytestmark = pytest.mark.store

#: The identifiers of the big message: MANY1 .. MANY150, in PID-3.
MANY = 150
BODY = "PID|1||" + "~".join(f"MANY{n}^^^HOSP" for n in range(1, MANY + 1)) + "||DOE^JANE\r"


def stored(dsn: str, **options: Any) -> tuple[int, int]:
    """Store the 150-identifier message and a small one through a real ingest (its config
    ``options``): their row ids."""

    async def run() -> None:
        async with Ingest(config(**options), dsn=dsn) as ingest:
            client = await Client.connect(ingest.mllp_ports["adt"])
            assert (await client.send(msg("BIG", body=BODY))).code == "AA"
            assert (await client.send(msg("SMALL"))).code == "AA"
            await client.close()

    register(dsn, "hospital/adt-out", "adt")
    asyncio.run(run())
    by_control = {r[3]: int(r[0]) for r in rows(dsn)}
    return by_control["BIG"], by_control["SMALL"]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    main([*args, "--json"])
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.parametrize("n", [1, 100, 101, 150])
def test_every_lookup_by_patient_finds_a_message_by_each_of_its_identifiers(
    fresh_db: str, capsys: pytest.CaptureFixture[str], n: int
) -> None:
    big, small = stored(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        row = conn.execute("SELECT patient_keys FROM inturn_delivery WHERE id = %s", (big,))
        keys = list(row.fetchone()[0])  # type: ignore[index]
    # the first 100 identifiers indexed (alone and with HOSP), the cut marked
    assert len(keys) == 201 and CAPPED_KEY in keys
    assert (lookup_key("MANY100") in keys, lookup_key("MANY101") in keys) == (True, False)
    patient = f"MANY{n}"
    listed = cli(capsys, "queue", "list", "--dsn", fresh_db, "--patient-id", patient, "--why", "t")
    assert ([i["id"] for i in listed["items"]], listed["total"]) == ([big], 1)
    by_authority = ["--patient-id", patient, "--authority", "HOSP"]
    listed = cli(capsys, "queue", "list", "--dsn", fresh_db, *by_authority, "--why", "t")
    assert [i["id"] for i in listed["items"]] == [big]
    other = ["--patient-id", patient, "--authority", "ELSEWHERE"]
    assert cli(capsys, "queue", "list", "--dsn", fresh_db, *other, "--why", "t")["items"] == []
    erase = ["queue", "erase", "--dsn", fresh_db, "--patient-id", patient, "--who", "me"]
    for scan in ([], ["--scan"]):
        dry = cli(capsys, *erase, "--why", "t", "--dry-run", *scan)
        assert ([m["id"] for m in dry["matched"]], dry["erased"]) == ([big], [])
    done = cli(capsys, *erase, "--why", "t")
    assert ([m["id"] for m in done["matched"]], done["erased"]) == ([big], [big])
    assert [r[0] for r in rows(fresh_db)] == [small]
    gone = cli(capsys, "queue", "list", "--dsn", fresh_db, "--patient-id", "MANY1", "--why", "t")
    assert gone["items"] == []


def test_an_identifier_no_message_names_is_found_nowhere(
    fresh_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stored(fresh_db)
    listed = cli(
        capsys, "queue", "list", "--dsn", fresh_db, "--patient-id", "MANY151", "--why", "t"
    )
    assert (listed["items"], listed["total"]) == ([], 0)
    erase = ["queue", "erase", "--dsn", fresh_db, "--patient-id", "MANY151", "--who", "me"]
    assert cli(capsys, *erase, "--why", "t")["erased"] == []
    assert len(rows(fresh_db)) == 2


def test_the_lookup_reads_the_patient_index_and_the_cut_rows_through_it(fresh_db: str) -> None:
    params = {
        "patient_key": "0" * 32,
        "also": [7],
        "destination": None,
        "channel": None,
        "state": None,
        "control_id": None,
        "before": None,
        "limit": 10,
        "offset": 0,
    }
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        # the plans of a fresh database: statistics an earlier test of this xdist worker left
        # (every row capped, say) make a walk of the primary key the cheaper plan, and the plan
        # would follow the order the files were handed out in
        conn.execute("DELETE FROM pg_statistic WHERE starelid = 'inturn_delivery'::regclass")
        conn.execute("SET enable_seqscan = off")
        cut = conn.execute(
            f"EXPLAIN {identifiers.Q['capped_batch']}", {"key": "0" * 32, "after": 0, "batch": 10}
        ).fetchall()
        listing = conn.execute(f"EXPLAIN {reads.Q['list_items_by_patient']}", params).fetchall()
    cut_plan = "\n".join(r[0] for r in cut)
    assert "inturn_delivery_patient" in cut_plan and "capped" in cut_plan
    listing_plan = "\n".join(r[0] for r in listing)
    # the GIN index for the key, the primary key for the ids the cut rows' payloads named
    assert "inturn_delivery_patient" in listing_plan and "inturn_delivery_pkey" in listing_plan


@pytest.mark.parametrize("n", [1, 150])
def test_sealed_rows_cut_at_the_cap_are_found_and_erased_with_the_keys(
    fresh_db: str, tmp_path: Path, key_dsn: str, capsys: pytest.CaptureFixture[str], n: int
) -> None:
    folder = keys.master_keys(tmp_path / "keys")
    big, small = stored(fresh_db, payload_keys=str(folder), key_dsn=key_dsn)
    assert all(envelope.is_envelope(bytes(r[5])) for r in rows(fresh_db))
    keyed = ["--payload-keys", str(folder), "--key-dsn", key_dsn]
    patient = ["--patient-id", f"MANY{n}"]
    listing = ["queue", "list", "--dsn", fresh_db, *patient, "--why", "t"]
    assert [i["id"] for i in cli(capsys, *listing, *keyed)["items"]] == [big]
    erase = ["queue", "erase", "--dsn", fresh_db, *patient, "--who", "me", "--why", "t"]
    for scan in ([], ["--scan"]):
        dry = cli(capsys, *erase, "--dry-run", *scan, *keyed)
        assert [m["id"] for m in dry["matched"]] == [big]
    done = cli(capsys, *erase, *keyed)
    assert done["erased"] == [big]
    if n == 1:  # an indexed identifier: its own key, under which the message is sealed
        assert done["keysDestroyed"] == 1
    assert [r[0] for r in rows(fresh_db)] == [small]
