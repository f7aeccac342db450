"""Benchmark spec.filter's field conditions on hostile input: patterns that make a backtracking
engine explode, the most values a reference reads, the longest values, the most patterns.

The patterns are matched by RE2 (:mod:`inturn.worker.hl7.types`), in time linear in the value.
For comparison it also times the backtracking translation inturn used before (Python's ``re``)
on the reported pattern at sizes it can finish (``*a*a*a*a*b`` over 280 characters took 10.3 s).

    python bench/filters.py [--repeat 5]

It also measures what routing one hostile message costs the other channels: the event loop's
longest stall (a ticker task every millisecond) while a 16 MiB message is routed to destinations
that read its fields, inline on the loop (as before) and through
:func:`inturn.worker.ingest.routing.route_message` (a worker thread), as ingest does.

Needs no database. Prints figures and asserts nothing; the last line is the JSON of the figures
(``worst_condition_ms``: one condition of 64 patterns over the most values a reference reads;
``loop_stall_ms``: the loop's longest stall, ``inline`` and ``offloaded``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections.abc import Callable

from figures import emit, parse_args

from inturn.worker.hl7.filter import (
    MAX_MATCH_BUDGET,
    MAX_VALUE_CHARS,
    MAX_VALUES_PER_REFERENCE,
    FieldCondition,
    FieldRef,
    MessageFields,
    conditions_of,
)
from inturn.worker.hl7.types import compile_pattern
from inturn.worker.ingest.routing import Route, RouteTable, route_message

HEADER = b"MSH|^~\\&|LAB|NORTH|LIS|NORTH|20260101||ORU^R01|C1|P|2.5.1\r"


def backtracking(pattern: str) -> re.Pattern[str]:
    """The translation used before RE2 (one ``.*`` per star, Python's backtracking engine)."""
    parts = [".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern]
    return re.compile("".join(parts), re.DOTALL)


def best(fn: Callable[[], object], repeat: int) -> float:
    """Fastest of ``repeat`` runs of ``fn``, seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def hostile_table(destinations: int) -> RouteTable:
    """``destinations`` destinations of channel ``c``, each with the most conditions a filter
    has (16, one per OBX field), each ``NotMatches`` the most patterns (64) of 199 characters."""
    patterns = ["*" + "a*" * 97 + f"{i:03d}" for i in range(64)]
    nodes = [
        {"field": f"OBX-{f}", "operator": "NotMatches", "values": patterns} for f in range(3, 19)
    ]
    conditions = conditions_of(nodes)
    return RouteTable(
        Route(f"ns/d{i}", "c", (), field_conditions=conditions) for i in range(destinations)
    )


def hostile_message(size: int) -> bytes:
    """A message of about ``size`` bytes: OBX segments of long distinct values."""
    out = [HEADER]
    total, i = len(HEADER), 0
    while total < size:
        seg = b"OBX|%d|NM|%07d%s|%s\r" % (i, i, b"a" * 1000, b"b" * 1000)
        out.append(seg)
        total += len(seg)
        i += 1
    return b"".join(out)


async def loop_stall(table: RouteTable, message: bytes, offloaded: bool) -> float:
    """The event loop's longest stall, seconds, while ``message`` is routed on ``table``."""
    stalls: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            stalls.append(now - last - 0.001)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    if offloaded:
        await route_message(table, "c", "ORU", "R01", message)
    else:
        table.route("c", "ORU", "R01", message)
    await asyncio.sleep(0.01)
    done.set()
    await tick
    return max(stalls)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--old-sizes", default="20,24,28", help="value lengths for the old engine")
    parser.add_argument("--message-mib", type=int, default=16, help="hostile message size")
    parser.add_argument("--destinations", type=int, default=20)
    args = parse_args(
        parser, argv, {"repeat": 1, "old_sizes": "12,16", "message_mib": 1, "destinations": 2}
    )
    figures: dict[str, object] = {}
    hostile = "*a*a*a*a*b"
    print(f"pattern {hostile!r} over 'a' * n (no match):")
    old: dict[str, float] = {}
    for n in (int(x) for x in args.old_sizes.split(",")):
        text = "a" * n
        seconds = best(lambda t=text: backtracking(hostile).fullmatch(t), args.repeat)
        old[str(n)] = seconds
        print(f"  backtracking re, n={n:5d}: {seconds * 1e3:10.3f} ms")
    for n in (280, MAX_VALUE_CHARS, 100_000):
        text = "a" * n
        seconds = best(lambda t=text: compile_pattern(hostile).fullmatch(t), args.repeat)
        figures[f"re2_{n}_us"] = round(seconds * 1e6, 1)
        print(f"  RE2,            n={n:5d}: {seconds * 1e3:10.3f} ms")
    eight = "*a*a*a*a*a*a*a*a*b"
    seconds = best(lambda: compile_pattern(eight).fullmatch("a" * MAX_VALUE_CHARS), args.repeat)
    figures["eight_stars_us"] = round(seconds * 1e6, 1)
    print(f"pattern with eight stars over {MAX_VALUE_CHARS} characters: {seconds * 1e6:.1f} us")

    # The worst a message can make one condition cost: the most values a reference reads, each
    # as long as is read, against the most patterns a condition holds (64), each 199 long.
    body = b"".join(
        b"OBX|%d|NM|%05d%s\r" % (i, i, b"a" * (MAX_VALUE_CHARS - 5))
        for i in range(MAX_VALUES_PER_REFERENCE)
    )
    message = HEADER + body
    patterns = tuple("*" + "a*" * 98 + f"{i:03d}" for i in range(64))
    ref = FieldRef.parse("OBX-3")
    condition = FieldCondition("OBX-3", ref, "NotMatches", patterns)
    times = []
    for _ in range(args.repeat):
        fields = MessageFields(message)
        fields.values(ref)  # parsing is ingest's fixed cost; time the matching
        start = time.perf_counter()
        condition.holds(fields)
        times.append(time.perf_counter() - start)
    seconds = min(times)
    figures["worst_condition_ms"] = round(seconds * 1e3, 2)
    figures["worst_condition_values"] = len(fields.values(ref))
    print(
        f"one NotMatches of 64 patterns (199 chars, 99 stars) over {len(fields.values(ref))}"
        f" values of {MAX_VALUE_CHARS} chars ({len(message) / 1e6:.1f} MB message), until the"
        f" message's matching budget ({MAX_MATCH_BUDGET:,}) is spent: {seconds * 1e3:.1f} ms"
    )

    size = args.message_mib * 1024 * 1024
    table, message = hostile_table(args.destinations), hostile_message(size)
    stall: dict[str, float] = {}
    for mode in ("inline", "offloaded"):
        worst = max(
            asyncio.run(loop_stall(table, message, mode == "offloaded")) for _ in range(args.repeat)
        )
        stall[mode] = round(worst * 1e3, 1)
    print(
        f"routing a {len(message) / 1e6:.1f} MB message to {args.destinations} destinations"
        f" reading 16 fields each: the event loop's longest stall {stall['inline']} ms inline,"
        f" {stall['offloaded']} ms through route_message (a worker thread)"
    )
    figures["loop_stall_ms"] = stall
    figures["backtracking_ms"] = {k: round(v * 1e3, 3) for k, v in old.items()}
    emit("filters", figures)


if __name__ == "__main__":
    main()
