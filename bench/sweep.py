"""Sweep benchmark: one ``inturn sweep`` pass over a large table with a known amount due.

    .venv/bin/python bench/sweep.py [--dsn DSN] [--rows 1000000] [--items 100000] [--due 10000]

Builds, in a fresh database: ``--rows`` delivery rows (all but the pending ones delivered long
ago) for 100 registered destinations, each holding 500 pending messages whose head waited past
its ``stuckAfterSeconds`` (900); on the destinations that set ``expireAfterSeconds`` (3600) all
but the newest 5 pending messages expired, which makes ``--due`` records due in all (the 100
stuck destinations and the expired messages); and ``--items`` worklist items that have nothing
to do with them (90 % cleared, 10 % pending). Then:

* the due queries under ``EXPLAIN (ANALYZE, BUFFERS)``: rows returned, rows the plan examined
  (every scan node's rows out plus rows removed by its filter, times its loops), examined per
  row returned, shared buffers touched, and whether any node is a sequential scan;
* one sweep with a limit above what is due (the seconds it took and what each rule did);
* a second sweep, with nothing new due (its seconds: the cost of a run that finds the work
  already placed);
* the same figures for a table ten times smaller with the same amount due, to show that the
  run time follows what is due rather than the size of the table.

Asserts nothing. The database is ``--dsn`` / ``INTURN_DSN`` (a server; the benchmark creates
and drops its own databases there), else an embedded Postgres (pgserver).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import AsyncConnection

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import delivery  # noqa: E402  (the sibling benchmark's database helpers)
from figures import emit, parse_args  # noqa: E402

from inturn.worker.operations.packs import select  # noqa: E402
from inturn.worker.store.migrate import migrate  # noqa: E402
from inturn.worker.store.queries import load  # noqa: E402
from inturn.worker.worklist.sweep import sweep  # noqa: E402

DESTINATIONS = 100
PENDING_PER_DESTINATION = 500
NOT_YET_EXPIRED = 5
STUCK_AFTER = 900
EXPIRE_AFTER = 3600
SCAN_NODES = {"Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan"}
DUE_QUERIES = ("stuck_due", "orphaned_due", "expired_due")


def build(dsn: str, rows: int, items: int, due: int) -> dict[str, int]:
    """Fill the database; return how much of each kind is due."""
    expiring = max(0, (due - DESTINATIONS) // (PENDING_PER_DESTINATION - NOT_YET_EXPIRED))
    pending = DESTINATIONS * PENDING_PER_DESTINATION
    finished = max(0, rows - pending)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel,"
            " stuck_after_seconds, expire_after_seconds)"
            " SELECT 'bench/d' || g, 'bench', 'd' || g, 'adt', %s,"
            "        CASE WHEN g <= %s THEN %s END"
            "   FROM generate_series(1, %s) g",
            (STUCK_AFTER, expiring, EXPIRE_AFTER, DESTINATIONS),
        )
        # Finished rows first (the old history), then each destination's pending backlog in
        # enqueue order: the oldest pending message is two hours old, the newest a second.
        conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size, state, enqueued_at, finished_at)"
            " SELECT 'bench/d' || (1 + g %% %s), 'adt', 'F' || g, 'ADT^A01', '\\x4d'::bytea, 1,"
            "        'delivered', now() - interval '3 days', now() - interval '3 days'"
            "   FROM generate_series(1, %s) g",
            (DESTINATIONS, finished),
        )
        conn.execute(
            "INSERT INTO inturn_delivery (destination, channel, control_id, message_type,"
            " payload, size, enqueued_at)"
            " SELECT 'bench/d' || d, 'adt', 'P' || d || '.' || n, 'ADT^A01', '\\x4d'::bytea, 1,"
            "        now() - make_interval(secs => CASE WHEN n > %s THEN %s - n"
            "                                           ELSE 7200 - n END)"
            "   FROM generate_series(1, %s) n, generate_series(1, %s) d ORDER BY n, d",
            (
                PENDING_PER_DESTINATION - NOT_YET_EXPIRED,
                PENDING_PER_DESTINATION + 1,
                PENDING_PER_DESTINATION,
                DESTINATIONS,
            ),
        )
        conn.execute(
            "INSERT INTO inturn_worklist_item (queue, record_kind, record_key, reason, placed_by,"
            " placed_at, state, cleared_at, cleared_by, note)"
            " SELECT 'delivery-failed', 'delivery', 'x' || g, 'attempts-exhausted', 'worker',"
            "        now() - interval '10 days',"
            "        CASE WHEN g %% 10 = 0 THEN 'pending' ELSE 'cleared' END,"
            "        CASE WHEN g %% 10 = 0 THEN NULL ELSE now() - interval '5 days' END,"
            "        CASE WHEN g %% 10 = 0 THEN NULL ELSE 'bench' END,"
            "        CASE WHEN g %% 10 = 0 THEN NULL ELSE 'done' END"
            "   FROM generate_series(1, %s) g",
            (items,),
        )
        conn.execute("VACUUM ANALYZE")
    return {
        "destination-stuck": DESTINATIONS,
        "delivery-expired": expiring * (PENDING_PER_DESTINATION - NOT_YET_EXPIRED),
    }


def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan."""
    out = [node]
    for child in node.get("Plans", []):
        out += walk(child)
    return out


def explain(dsn: str, name: str, limit: int) -> dict[str, Any]:
    """Rows returned, rows examined, buffers and scan kinds of one due query."""
    query = load("sweep.sql")[name]
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query,  # type: ignore[operator]
            # no destination of the bench has a delivery window: none is open or closed
            {"limit": limit, "schedules": [], "since": []},
        )
        row = cur.fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    nodes = walk(plan)
    examined = sum(
        (n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)) * n.get("Actual Loops", 1)
        for n in nodes
        if n["Node Type"] in SCAN_NODES
    )
    returned = plan.get("Actual Rows", 0)
    return {
        "query": name,
        "returned": returned,
        "examined": examined,
        "per_row": examined / returned if returned else float(examined),
        "buffers": plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0),
        "seq_scans": sorted(
            {n.get("Relation Name", "?") for n in nodes if n["Node Type"] == "Seq Scan"}
        ),
        "ms": plan.get("Actual Total Time", 0.0),
    }


async def timed_sweep(dsn: str, limit: int) -> tuple[float, list[str]]:
    """One sweep of the delivery rules: seconds and its summary lines."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        report = await sweep(conn, select(("delivery",)), limit=limit)
        seconds = time.perf_counter() - started
    return seconds, [r.summary(False) for r in report.results]


def run_size(server: str, rows: int, items: int, due: int) -> dict[str, Any]:
    """Build one database of ``rows`` rows, measure, drop it."""
    with delivery.fresh_database(server, "sweep") as dsn:
        migrate(dsn)
        started = time.perf_counter()
        expected = build(dsn, rows, items, due)
        print(f"  built {rows:,} delivery rows, {items:,} worklist items in"
              f" {time.perf_counter() - started:.1f} s; due: {expected}")  # fmt: skip
        limit = due + DESTINATIONS
        plans = [explain(dsn, name, limit) for name in DUE_QUERIES]
        for p in plans:
            print(
                f"  {p['query']:<13} returned {p['returned']:>6,}  examined {p['examined']:>7,}"
                f"  ({p['per_row']:.2f} per row)  buffers {p['buffers']:>6,}"
                f"  {p['ms']:.0f} ms  seq scans: {', '.join(p['seq_scans']) or 'none'}"
            )
        first, lines = asyncio.run(timed_sweep(dsn, limit))
        for line in lines:
            print(f"  {line}")
        second, _ = asyncio.run(timed_sweep(dsn, limit))
        print(f"  first sweep {first:.1f} s, second sweep (nothing new) {second:.2f} s")
        placed = sum(expected.values())
        return {"first": first, "second": second, "placed": placed, "plans": plans}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print its figures and a last summary line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("INTURN_DSN"))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--due", type=int, default=10_000)
    args = parse_args(parser, argv, {"rows": 2000, "items": 200, "due": 50})
    with delivery.postgres_server(args.dsn) as (server, _):
        print(f"large table ({args.rows:,} rows):")
        large = run_size(server, args.rows, args.items, args.due)
        small_rows = max(args.rows // 10, DESTINATIONS * PENDING_PER_DESTINATION)
        print(f"small table ({small_rows:,} rows), same due:")
        small = run_size(server, small_rows, args.items // 10, args.due)
    examined = sum(p["examined"] for p in large["plans"])
    returned = sum(p["returned"] for p in large["plans"]) or 1
    print(
        f"sweep: {large['first']:.1f} s for {large['placed']:,} due over {args.rows:,} rows"
        f" ({small['first']:.1f} s over {small_rows:,}); rerun {large['second']:.2f} s;"
        f" {examined / returned:.2f} rows examined per placement"
    )
    emit(
        "sweep",
        {
            "rows": args.rows,
            "due": large["placed"],
            "first_sweep_s": round(large["first"], 3),
            "rerun_s": round(large["second"], 3),
            "small_table_first_sweep_s": round(small["first"], 3),
            "rows_examined_per_placement": round(examined / returned, 2),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
