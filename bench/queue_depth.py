"""Depth on the channel log: what ``inturn queue depth`` (and /metrics, the console's overview,
the operator's status) costs with 200 destinations on one channel (issue 43).

    .venv/bin/python bench/queue_depth.py [--dsn DSN] [--destinations 200] [--messages 100000]
                                          [--behind 10000] [--runs 20]

Builds, in a fresh database: ``--destinations`` registered destinations on one channel and
``--messages`` messages in its log, nine in ten routed to every destination and one in ten to a
tenth of them (ten route sets), as a feed with field filters makes them. Then, each the median
of ``--runs`` calls:

* every cursor at the log's end (every worker live): ``depth`` for all, ``status_depth``
  (the operator's), ``heads`` of every destination (the console's overview), and one
  destination's ``depth`` (the worker's gauge);
* one destination's cursor ``--behind`` messages back (its worker stopped): the same, with
  the count checked exact;
* ``inturn_unpulled`` for all under ``EXPLAIN (ANALYZE, BUFFERS)``: shared buffers touched;
* a lookup by patient and by MSH-10 matching one message in a hundred (each checked against
  its route set's cursors for lines not pulled yet).

Asserts nothing (the count checked exact is a sanity check of the build). The database is
``--dsn`` / ``INTURN_DSN`` (a server; the benchmark creates and drops its own database there),
else an embedded Postgres (pgserver).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import AsyncConnection

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import delivery  # noqa: E402  (the sibling benchmark's database helpers)
from figures import emit, parse_args  # noqa: E402

from inturn.worker.store import reads, registry  # noqa: E402
from inturn.worker.store.migrate import migrate  # noqa: E402

CHANNEL = "adt"
#: The figure's goal: a depth read for every destination well inside a /metrics scrape.
TARGET_MS = 50.0


def build(dsn: str, destinations: list[str], messages: int) -> list[int]:
    """Register the destinations and fill the log; every cursor at its end. The log ids."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel)"
            " SELECT d, split_part(d, '/', 1), split_part(d, '/', 2), %s"
            " FROM unnest(%s::text[]) AS d",
            (CHANNEL, destinations),
        )
        tenth = max(1, len(destinations) // 10)
        sets = [sorted(destinations)] + [
            sorted(destinations[i * tenth : (i + 1) * tenth]) for i in range(10)
        ]
        routes = []
        for s in sets:
            [(rid,)] = conn.execute(
                "INSERT INTO inturn_route (channel, destinations) VALUES (%s, %s)"
                " ON CONFLICT (channel, destinations) DO UPDATE SET channel = EXCLUDED.channel"
                " RETURNING id",
                (CHANNEL, s),
            ).fetchall()
            routes.append(rid)
        conn.execute(
            "INSERT INTO inturn_message (channel, control_id, message_type, payload, size,"
            " route, patient_keys)"
            " SELECT %s, 'M' || g, 'ADT^A01', convert_to(repeat('x', 200), 'UTF8'), 200,"
            "        CASE WHEN g %% 10 = 0 THEN (%s::int[])[2 + (g / 10) %% 10]"
            "             ELSE (%s::int[])[1] END, '{k}'"
            "   FROM generate_series(1, %s) AS g",
            (CHANNEL, routes, routes, messages),
        )
        conn.execute(
            "UPDATE inturn_message SET patient_keys = '{k-one-in-100}', control_id = 'ONE-IN-100'"
            " WHERE id % 100 = 0"
        )
        ids = [r[0] for r in conn.execute("SELECT id FROM inturn_message ORDER BY id")]
        conn.execute(
            "INSERT INTO inturn_cursor (destination, channel, position)"
            " SELECT d, %s, %s FROM unnest(%s::text[]) AS d",
            (CHANNEL, ids[-1], destinations),
        )
        conn.execute("ANALYZE")
    return ids


async def median_ms(runs: int, call: Callable[[], Awaitable[Any]]) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


async def measure(dsn: str, destinations: list[str], runs: int) -> dict[str, float]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        return {
            "depth_all_ms": await median_ms(runs, lambda: reads.depth(conn)),
            "status_ms": await median_ms(runs, lambda: registry.status_depth(conn)),
            "heads_ms": await median_ms(runs, lambda: reads.heads(conn, destinations)),
            "depth_one_ms": await median_ms(runs, lambda: reads.depth(conn, destinations[0])),
            # a patient named by one message in a hundred, and as many sharing one MSH-10: the
            # lookups check each message's route set against the cursors (lines not pulled)
            "patient_lookup_ms": await median_ms(
                runs, lambda: reads.list_items(conn, patient_key="k-one-in-100")
            ),
            "msh10_lookup_ms": await median_ms(
                runs, lambda: reads.list_items(conn, control_id="ONE-IN-100")
            ),
        }


def buffers(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        [(plan,)] = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM inturn_unpulled(NULL)"
        ).fetchall()
    top = plan[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("INTURN_DSN"))
    parser.add_argument("--destinations", type=int, default=200)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--behind", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=20)
    args = parse_args(parser, argv, {"destinations": 20, "messages": 500, "behind": 50, "runs": 3})
    destinations = [f"fan/d{i:03}" for i in range(args.destinations)]
    with (
        delivery.postgres_server(args.dsn) as (server, _),
        delivery.fresh_database(server, "depth") as dsn,
    ):
        migrate(dsn)
        ids = build(dsn, destinations, args.messages)
        live = await measure(dsn, destinations, args.runs)
        print(f"{args.destinations} destinations, {args.messages} log messages, all pulled:")
        for name, value in live.items():
            print(f"  {name}: {value} ms")
        behind = destinations[0]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE inturn_cursor SET position = %s WHERE destination = %s",
                (ids[-1 - args.behind], behind),
            )
            [(expected,)] = conn.execute(
                "SELECT count(*) FROM inturn_message m JOIN inturn_route r ON r.id = m.route"
                " WHERE m.id > %s AND %s = ANY(r.destinations)",
                (ids[-1 - args.behind], behind),
            ).fetchall()
        lagging = await measure(dsn, destinations, args.runs)
        async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
            [row] = await reads.depth(conn, behind)
        exact = row.pending == expected
        print(f"one destination {args.behind} messages behind ({expected} routed to it):")
        for name, value in lagging.items():
            print(f"  {name}: {value} ms")
        print(f"  its depth exact: {exact}")
        touched = buffers(dsn)
        print(f"inturn_unpulled(NULL): {touched} shared buffers")
    emit(
        "queue_depth",
        {
            "destinations": args.destinations,
            "messages": args.messages,
            **{f"live_{k}": v for k, v in live.items()},
            **{f"behind_{k}": v for k, v in lagging.items()},
            "behind_exact": exact,
            "unpulled_buffers": touched,
            "target_depth_all_ms": TARGET_MS,
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
