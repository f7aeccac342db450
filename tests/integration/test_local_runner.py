"""``inturn local``'s runner: the registry follows the manifests, also across runs."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import click
import psycopg
import pytest

from inturn.worker.ingest.config import IngestConfig
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.local.manifests import check_sender, load_all
from inturn.worker.local.run import (
    LOCAL_LEASE_SECONDS,
    DatabaseInUse,
    LocalRunner,
    in_use,
    run_local,
)
from inturn.worker.store import locks, queue, registry
from inturn.worker.store.model import NewItem


def write(
    tmp_path: Path,
    name: str,
    channel: str = "adt",
    tls: bool = False,
    carriers: tuple[str, ...] = (),
) -> Path:
    extra = "\n      tls: {secretRef: {name: partner}}" if tls else ""
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        "apiVersion: inturn.dev/v1alpha1\nkind: Destination\n"
        f"metadata: {{name: {name}}}\n"
        f"spec:\n  channel: {channel}\n"
        f"  carriers: [{', '.join(carriers)}]\n"
        f"  sender:\n    mllp:\n      host: 127.0.0.1\n      port: 9{extra}\n"
        "  retry: {maxAttempts: 0}\n"
    )
    return path


async def active(dsn: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return sorted(r.destination for r in await registry.list_all(conn) if not r.deleted)


async def test_destinations_of_an_earlier_run_are_no_longer_routed(
    fresh_db: str, tmp_path: Path
) -> None:
    first = tmp_path / "first"
    first.mkdir()
    write(first, "old")
    write(first, "kept")
    runner = LocalRunner(fresh_db, [first])
    await runner.start()
    await runner.stop()
    assert await active(fresh_db) == ["default/kept", "default/old"]
    (first / "old.yaml").unlink()
    runner = LocalRunner(fresh_db, [first])
    await runner.start()
    try:
        assert await active(fresh_db) == ["default/kept"]
        assert sorted(runner.running) == ["default/kept"]
    finally:
        await runner.stop()


def test_a_missing_tls_file_is_named_before_anything_starts(tmp_path: Path) -> None:
    write(tmp_path, "secure", tls=True)
    [cfg] = load_all([tmp_path], Path("secrets")).values()
    with pytest.raises(click.ClickException) as info:
        check_sender(cfg)
    assert "secrets/partner/ca.crt" in info.value.message


def test_two_manifests_serving_one_carrier_are_refused(tmp_path: Path) -> None:
    write(tmp_path, "a", carriers=("LH", "OS"))
    write(tmp_path, "b", carriers=("UA", "LH"))
    with pytest.raises(click.ClickException) as info:
        load_all([tmp_path], None)
    assert info.value.message.endswith(
        "b.yaml: default/b: spec.carriers: LH is already served by default/a"
    )


async def test_carriers_follow_the_manifests_and_may_move(fresh_db: str, tmp_path: Path) -> None:
    write(tmp_path, "a", carriers=("LH",))
    write(tmp_path, "b", carriers=("UA",))
    runner = LocalRunner(fresh_db, [tmp_path])
    await runner.start()
    try:
        write(tmp_path, "a", carriers=("UA",))
        write(tmp_path, "b", carriers=("LH", "OS"))
        await runner.apply(load_all([tmp_path], None))
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            rows = {r.destination: r.carriers for r in await registry.list_all(conn)}
        assert rows == {"default/a": ("UA",), "default/b": ("LH", "OS")}
    finally:
        await runner.stop()


async def test_a_second_inturn_local_on_the_same_database_is_refused(
    fresh_db: str, tmp_path: Path
) -> None:
    """One ``inturn local`` owns a database's registry: a second one (the same data directory
    through a DSN, or the same --dsn) is refused before it retires the first one's
    destinations, which would silently stop their routing."""
    first = tmp_path / "first"
    first.mkdir()
    write(first, "running")
    runner = LocalRunner(fresh_db, [first])
    await runner.start()
    await runner.stop()
    second = tmp_path / "second"
    second.mkdir()
    write(second, "other")
    config = IngestConfig(listeners=[ListenerConfig(channel="adt", host="127.0.0.1", port=0)])
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as holder:
        # the first inturn local's lease, its session alive
        assert await locks.take_singleton(holder, "local", "first-local", 30) is not None
        with pytest.raises(DatabaseInUse) as refused:
            await run_local(fresh_db, [second], config, None, asyncio.Event())
    assert str(refused.value) == (  # a direct connection: the holder's session is alive
        "this database is in use by another inturn local (it owns the destination registry):"
        " stop it, or give this one a database of its own"
    )
    assert await active(fresh_db) == ["default/running"]  # nothing retired, nothing added


async def test_the_sweeper_runs_inside_inturn_local(fresh_db: str, tmp_path: Path) -> None:
    """A destination whose receiver never answers reaches the delivery-stuck worklist by the
    sweeper that ``inturn local`` runs itself (here every half second; a minute by default)."""
    path = write(tmp_path, "nowhere")
    path.write_text(path.read_text() + "  alerting: {stuckAfterSeconds: 1}\n")
    config = IngestConfig(listeners=[ListenerConfig(channel="adt", host="127.0.0.1", port=0)])
    stop = asyncio.Event()
    run = asyncio.create_task(run_local(fresh_db, [path], config, None, stop, sweep_every=0.5))
    try:
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            for _ in range(100):  # until the runner registered the destination
                if "default/nowhere" in await active(fresh_db):
                    break
                await asyncio.sleep(0.1)
            payload = b"MSH|^~\\&|A|B|C|D|20260101||ADT^A01|SW1|P|2.5\rPID|1||1\r"
            await queue.enqueue(
                conn,
                [NewItem("default/nowhere", "adt", "SW1", "ADT^A01", payload)],
            )
            placed = None
            for _ in range(300):
                placed = await (
                    await conn.execute(
                        "SELECT queue, reason, placed_by FROM inturn_worklist_item"
                        " WHERE record_key = 'default/nowhere' AND state = 'pending'"
                    )
                ).fetchone()
                if placed:
                    break
                await asyncio.sleep(0.1)
            assert placed == ("delivery-stuck", "destination-stuck", "sweeper")
    finally:
        stop.set()
        await run


async def test_field_filters_of_a_manifest_reach_the_registry(
    fresh_db: str, tmp_path: Path
) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples" / "engine"
    shutil.copy(examples / "bed-board-4w.yaml", tmp_path)
    runner = LocalRunner(fresh_db, [tmp_path])
    await runner.start()
    try:
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            [row] = await registry.list_all(conn)
        assert row.destination == "wards/bed-board-4w"
        assert row.filter_fields == [
            {"field": "PV1-3", "operator": "Matches", "values": ["4W*"]},
            {"field": "MSH-3", "operator": "In", "values": ["PAS"]},
            {"field": "PID-3.4", "operator": "NotIn", "values": ["TEST"]},
        ]
    finally:
        await runner.stop()


async def test_one_invalid_manifest_holds_back_every_change_until_all_are_valid(
    fresh_db: str, tmp_path: Path
) -> None:
    """docs/reference/local.md, Manifests: the files are applied all or nothing; while one
    does not validate, a removal and an addition elsewhere wait, and both apply once it does."""
    write(tmp_path, "a")
    write(tmp_path, "b")
    runner = LocalRunner(fresh_db, [tmp_path], removal_grace=0)
    await runner.start()
    try:
        (tmp_path / "b.yaml").unlink()
        write(tmp_path, "c")
        (tmp_path / "ar.yaml").write_text("apiVersion: inturn.dev/v1alpha1\nkind: Destination\n")
        await runner.poll()
        assert sorted(runner.running) == ["default/a", "default/b"]
        assert await active(fresh_db) == ["default/a", "default/b"]
        write(tmp_path, "ar")
        await runner.poll()
        assert sorted(runner.running) == ["default/a", "default/ar", "default/c"]
        assert await active(fresh_db) == ["default/a", "default/ar", "default/c"]
    finally:
        await runner.stop()


def test_behind_a_pooler_the_refusal_names_the_lease_s_bound() -> None:
    """Behind a transaction-mode pooler a killed inturn local's lease outlives it: the refusal
    says so, with the lease's real bound, rather than asking to stop a process that is gone."""
    assert LOCAL_LEASE_SECONDS == 30.0
    assert in_use(pooled=True) == (
        "this database is in use by another inturn local (it owns the destination registry),"
        " or was until lately: behind a pooler the holder is judged by its lease, which"
        " expires within 30 s of its last renewal (a killed inturn local's too): if none runs"
        " any more, wait that long and start again; else stop the other, or give this one a"
        " database of its own"
    )


async def test_inturn_local_keeps_a_restore_witness_and_holds_after_a_restore(
    fresh_db: str, tmp_path: Path
) -> None:
    """The run looks at its witness file before its workers start: a file recording a later
    tick than the database holds (the database was restored) holds the destination at once."""
    path = write(tmp_path, "nowhere")
    witness = tmp_path / ".inturn" / "restore-witness.json"
    witness.parent.mkdir()
    witness.write_text('{"tick": 1000000, "destinations": {}}')
    config = IngestConfig(listeners=[ListenerConfig(channel="adt", host="127.0.0.1", port=0)])
    stop = asyncio.Event()
    run = asyncio.create_task(
        run_local(fresh_db, [path], config, None, stop, sweep_every=None, witness=witness)
    )
    try:
        held = None
        for _ in range(100):
            with psycopg.connect(fresh_db) as conn:
                held = conn.execute(
                    "SELECT held_by FROM inturn_destination WHERE destination = 'default/nowhere'"
                ).fetchone()
            if held and held[0]:
                break
            await asyncio.sleep(0.1)
        assert held == ("inturn-local",)
    finally:
        stop.set()
        await run
    recorded = json.loads(witness.read_text())
    assert recorded["tick"] < 1000000 and "default/nowhere" in recorded["destinations"]


async def test_a_manifest_gone_for_a_moment_keeps_its_destination_routed(
    fresh_db: str, tmp_path: Path
) -> None:
    """A file replaced by an editor or a sync is missing for a moment: its destination stays
    registered and running through the grace, and is removed once the grace has passed."""
    write(tmp_path, "a")
    write(tmp_path, "b")
    runner = LocalRunner(fresh_db, [tmp_path], removal_grace=3600)
    await runner.start()
    try:
        kept = (tmp_path / "b.yaml").read_text()
        (tmp_path / "b.yaml").unlink()
        await runner.poll()
        assert sorted(runner.running) == ["default/a", "default/b"]
        assert await active(fresh_db) == ["default/a", "default/b"]
        (tmp_path / "b.yaml").write_text(kept)  # back: nothing was removed, nothing restarted
        worker = runner.running["default/b"].worker
        await runner.poll()
        assert runner.running["default/b"].worker is worker
        (tmp_path / "b.yaml").unlink()
        await runner.poll()
        assert await active(fresh_db) == ["default/a", "default/b"]
        runner.removal_grace = 0  # the grace has passed: the next look removes it
        await runner.poll()
        assert sorted(runner.running) == ["default/a"]
        assert await active(fresh_db) == ["default/a"]
    finally:
        await runner.stop()


async def test_a_worker_whose_step_keeps_failing_makes_inturn_local_not_ready(
    fresh_db: str, tmp_path: Path
) -> None:
    """A new user's trial: /readyz said ready while the delivered mark failed on a full disk.
    The runner's readiness names each worker whose step is being repeated on a live session."""
    write(tmp_path, "a")
    write(tmp_path, "b")
    runner = LocalRunner(fresh_db, [tmp_path])
    await runner.start()
    try:
        assert runner.not_ready() is None
        state = runner.running["default/b"].worker.state
        state.trouble = "the delivered mark of id=812 failed: disk full (SQLSTATE 53100)"
        assert runner.not_ready() == (
            "default/b: the delivered mark of id=812 failed: disk full (SQLSTATE 53100)"
        )
        state.trouble = None
        assert runner.not_ready() is None
    finally:
        await runner.stop()


def test_every_problem_of_the_manifests_is_named_at_once(tmp_path: Path) -> None:
    """A new user's trial: with a copy of r04 and a bad r05, only the copy's line was logged,
    naming the original file. Every file is read and every problem named, both files of a
    destination declared twice among them."""
    write(tmp_path, "r04")
    shutil.copy(tmp_path / "r04.yaml", tmp_path / "r04-copy.yaml")
    bad = write(tmp_path, "r05")
    bad.write_text(bad.read_text().replace("port: 9", "port: nine"))
    with pytest.raises(click.ClickException) as raised:
        load_all([tmp_path], None)
    lines = raised.value.format_message().splitlines()
    assert len(lines) == 2
    assert lines[0] == (
        f"{tmp_path / 'r04.yaml'}: destination default/r04 is declared twice (also in"
        f" {tmp_path / 'r04-copy.yaml'})"
    )
    assert lines[1] == f"{bad}#1: spec.sender.mllp.port: must be an integer"


def series(destination: str) -> list[str]:
    """The ``/metrics`` lines of the worker's metrics that name ``destination``."""
    from prometheus_client import generate_latest

    text = generate_latest().decode()
    return [
        line
        for line in text.splitlines()
        if f'destination="{destination}"' in line and line.startswith("inturn_")
    ]


async def test_a_removed_destination_leaves_no_series_in_metrics(
    fresh_db: str, tmp_path: Path
) -> None:
    """A new user's trial: after a manifest was removed from ``inturn local``, /metrics kept its
    last queue depth, lock and hold values for ever (alerts on them kept firing). A removal
    takes its series away; the destination that stays keeps its own; one added back starts
    afresh."""
    write(tmp_path, "keep")
    write(tmp_path, "gone")
    runner = LocalRunner(fresh_db, [tmp_path], removal_grace=0)
    await runner.start()
    try:
        async with asyncio.timeout(30):  # each worker's first depth and lock
            while not all(
                any(s.startswith(name) for s in series(dest))
                for dest in ("default/gone", "default/keep")
                for name in ("inturn_queue_pending{", "inturn_lock_held{")
            ):
                await asyncio.sleep(0.05)
        (tmp_path / "gone.yaml").unlink()
        await runner.poll()
        assert sorted(runner.running) == ["default/keep"]
        assert series("default/gone") == []
        assert any(s.startswith("inturn_queue_pending{") for s in series("default/keep"))
        write(tmp_path, "gone")
        await runner.poll()
        async with asyncio.timeout(30):
            while not any(s.startswith("inturn_lock_held{") for s in series("default/gone")):
                await asyncio.sleep(0.05)
    finally:
        await runner.stop()
