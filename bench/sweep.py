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
  run time follows what is due rather than the size of the table;
* the hospital packs on the large database: ``--channels`` declared feeds (half with an
  always-open schedule), ``--silent`` of them silent past their ``silentAfterSeconds``, and
  ``--orders`` order expectations (``spec.replies``), ``--overdue`` of them past due and a
  quarter answered: ``silent_due`` and ``unanswered_due`` under ``EXPLAIN (ANALYZE, BUFFERS)``
  (rows examined per placement), then one sweep of the ``feeds`` and ``orders`` packs and a
  rerun.

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
from psycopg.types.json import Jsonb

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import delivery  # noqa: E402  (the sibling benchmark's database helpers)
from figures import emit, parse_args  # noqa: E402

from inturn.worker.operations.packs import select  # noqa: E402
from inturn.worker.store.migrate import migrate  # noqa: E402
from inturn.worker.store.queries import load  # noqa: E402
from inturn.worker.worklist.sweep import sweep  # noqa: E402
from inturn.worker.worklist.windows import open_windows  # noqa: E402

DESTINATIONS = 100
PENDING_PER_DESTINATION = 500
NOT_YET_EXPIRED = 5
STUCK_AFTER = 900
EXPIRE_AFTER = 3600
SCAN_NODES = {"Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan"}
DUE_QUERIES = ("stuck_due", "orphaned_due", "expired_due")
#: The hospital packs' due queries: (file, query).
HOSPITAL_QUERIES = (("feed_rules.sql", "silent_due"), ("order_rules.sql", "unanswered_due"))
#: A schedule open at all times (UTC, every day), on half the benchmark's feeds.
ALWAYS = {
    "timeZone": "UTC",
    "windows": [
        {
            "days": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"],
            "start": "00:00",
            "end": "24:00",
        }
    ],
}


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


def build_hospital(dsn: str, channels: int, silent: int, orders: int, overdue: int) -> None:
    """Declared feeds and order expectations, next to the delivery rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_feed (channel, silent_after_seconds, per_sender, schedule,"
            " declared_at, last_message_at)"
            " SELECT 'c' || g, 600, false, CASE WHEN g %% 2 = 0 THEN %s::jsonb END,"
            "        now() - interval '30 days',"
            "        CASE WHEN g <= %s THEN now() - make_interval(secs => 3600 + g)"
            "             ELSE now() - interval '1 minute' END"
            "   FROM generate_series(1, %s) g",
            (Jsonb(ALWAYS), silent, channels),
        )
        conn.execute(
            "INSERT INTO inturn_order_expectation (destination, delivery_id, control_id,"
            " message_type, order_key, key_digest, reply_channel, reply_types, delivered_at,"
            " due_at, answered_at)"
            " SELECT 'bench/d' || (1 + g %% 100), g, 'O' || g, 'ORM^O01', 'PL' || g,"
            "        left(md5(g::text), 32), 'results', '{ORU^R01}', now() - interval '5 hours',"
            "        CASE WHEN g <= %s THEN now() - make_interval(secs => g)"
            "             ELSE now() + interval '1 hour' END,"
            "        CASE WHEN g > %s AND g %% 4 = 0 THEN now() END"
            "   FROM generate_series(1, %s) g",
            (overdue, overdue, orders),
        )
        conn.execute("VACUUM ANALYZE inturn_feed, inturn_order_expectation")


def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan."""
    out = [node]
    for child in node.get("Plans", []):
        out += walk(child)
    return out


def explain(
    dsn: str, name: str, limit: int, file: str = "sweep.sql", windows: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Rows returned, rows examined, buffers and scan kinds of one due query."""
    query = load(file)[name]
    # no destination of the bench has a delivery window: none is open or closed
    params = {"limit": limit, **(windows or {"schedules": [], "since": []})}
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query,  # type: ignore[operator]
            params,
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


async def timed_sweep(
    dsn: str, limit: int, only: tuple[str, ...] = ("delivery",)
) -> tuple[float, list[str]]:
    """One sweep of the ``only`` packs: seconds and its summary lines."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        report = await sweep(conn, select(only), limit=limit)
        seconds = time.perf_counter() - started
    return seconds, [r.summary(False) for r in report.results]


def print_plan(p: dict[str, Any]) -> None:
    print(
        f"  {p['query']:<14} returned {p['returned']:>6,}  examined {p['examined']:>7,}"
        f"  ({p['per_row']:.2f} per row)  buffers {p['buffers']:>6,}"
        f"  {p['ms']:.0f} ms  seq scans: {', '.join(p['seq_scans']) or 'none'}"
    )


def run_hospital(dsn: str, hospital: dict[str, int]) -> dict[str, Any]:
    """The feeds and orders packs on a built database: plans, one sweep and a rerun."""
    started = time.perf_counter()
    build_hospital(dsn, **hospital)
    print(
        f"  built {hospital['channels']:,} feeds ({hospital['silent']:,} silent) and"
        f" {hospital['orders']:,} order expectations ({hospital['overdue']:,} overdue) in"
        f" {time.perf_counter() - started:.1f} s"
    )
    limit = max(hospital["silent"], hospital["overdue"]) + 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        windows = open_windows([ALWAYS], row[0])
    plans = [explain(dsn, q, limit, f, windows) for f, q in HOSPITAL_QUERIES]
    for p in plans:
        print_plan(p)
    first, lines = asyncio.run(timed_sweep(dsn, limit, ("feeds", "orders")))
    for line in lines:
        print(f"  {line}")
    second, _ = asyncio.run(timed_sweep(dsn, limit, ("feeds", "orders")))
    print(f"  feeds+orders: first sweep {first:.1f} s, second sweep (nothing new) {second:.2f} s")
    return {"first": first, "second": second, "plans": plans}


def run_size(
    server: str, rows: int, items: int, due: int, hospital: dict[str, int] | None = None
) -> dict[str, Any]:
    """Build one database of ``rows`` rows, measure, drop it (with ``hospital``, the feeds and
    orders packs too)."""
    with delivery.fresh_database(server, "sweep") as dsn:
        migrate(dsn)
        started = time.perf_counter()
        expected = build(dsn, rows, items, due)
        print(f"  built {rows:,} delivery rows, {items:,} worklist items in"
              f" {time.perf_counter() - started:.1f} s; due: {expected}")  # fmt: skip
        limit = due + DESTINATIONS
        plans = [explain(dsn, name, limit) for name in DUE_QUERIES]
        for p in plans:
            print_plan(p)
        first, lines = asyncio.run(timed_sweep(dsn, limit))
        for line in lines:
            print(f"  {line}")
        second, _ = asyncio.run(timed_sweep(dsn, limit))
        print(f"  first sweep {first:.1f} s, second sweep (nothing new) {second:.2f} s")
        placed = sum(expected.values())
        out = {"first": first, "second": second, "placed": placed, "plans": plans}
        if hospital is not None:
            out["hospital"] = run_hospital(dsn, hospital)
        return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print its figures and a last summary line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("INTURN_DSN"))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--due", type=int, default=10_000)
    parser.add_argument("--channels", type=int, default=10_000, help="declared feeds")
    parser.add_argument("--silent", type=int, default=1_000, help="of them silent")
    parser.add_argument("--orders", type=int, default=200_000, help="order expectations")
    parser.add_argument("--overdue", type=int, default=10_000, help="of them overdue")
    args = parse_args(
        parser,
        argv,
        {
            "rows": 2000,
            "items": 200,
            "due": 50,
            "channels": 100,
            "silent": 10,
            "orders": 1000,
            "overdue": 50,
        },
    )
    hospital = {
        "channels": args.channels,
        "silent": args.silent,
        "orders": args.orders,
        "overdue": args.overdue,
    }
    with delivery.postgres_server(args.dsn) as (server, _):
        print(f"large table ({args.rows:,} rows):")
        large = run_size(server, args.rows, args.items, args.due, hospital)
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
    h = large["hospital"]
    per = {p["query"]: p["per_row"] for p in h["plans"]}
    print(
        f"feeds and orders: {h['first']:.1f} s for {args.silent:,} silent of"
        f" {args.channels:,} feeds and {args.overdue:,} overdue of {args.orders:,} orders over"
        f" {args.rows:,} delivery rows; rerun {h['second']:.2f} s; rows examined per placement:"
        f" feed-silent {per['silent_due']:.2f}, unanswered-order {per['unanswered_due']:.2f}"
    )
    emit(
        "sweep",
        {
            "feeds_orders_first_sweep_s": round(h["first"], 3),
            "feeds_orders_rerun_s": round(h["second"], 3),
            "feed_silent_rows_examined_per_placement": round(per["silent_due"], 2),
            "unanswered_order_rows_examined_per_placement": round(per["unanswered_due"], 2),
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
