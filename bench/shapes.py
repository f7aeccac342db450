"""Benchmark ingest's per-message work on the worst message shapes: seconds of CPU per MiB.

For each shape of :func:`inturn.worker.testing.worst_shapes` (many distinct or identical
repetitions, many segments, deep components, one long field, escapes, LF terminators) at two
sizes, times what ingest does with a message before it stores it: MSH parsing
(:func:`parse_header`), the MLLP destination's refusal check, and :func:`prepare` (terminators,
SHA-256, the capped patient identifier index). Linear work costs the same per MiB at both sizes;
the last column is that ratio (large / small, about 1 when linear, 70 for the quadratic scan that
froze ingest on 12,000 PID-3 repetitions).

    python bench/shapes.py [--small 176k] [--large 16M] [--repeat 3]

Needs no database. Prints figures and asserts nothing; the last line is
``shapes: worst W s/MiB (SHAPE); worst ratio R``.
"""

from __future__ import annotations

import argparse
import time

from figures import emit, parse_args

from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.pid import MAX_INDEXED_IDENTIFIERS
from inturn.worker.ingest.prepare import prepare
from inturn.worker.senders.registry import refusal
from inturn.worker.testing import worst_shapes

MIB = 1024 * 1024


def size(text: str) -> int:
    """``176k``, ``16M`` or a plain number of bytes."""
    units = {"k": 1024, "m": MIB, "g": 1024 * MIB}
    unit = units.get(text[-1:].lower(), 1)
    return int(float(text[:-1] if unit > 1 else text) * unit)


def cost(payload: bytes, repeat: int) -> float:
    """Best-of-``repeat`` seconds for one message's pre-storage work."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        header = parse_header(payload)
        refusal("mllp", payload)
        prepare(header, payload, MAX_INDEXED_IDENTIFIERS)
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print one line per shape and a summary line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", default="176k")
    parser.add_argument("--large", default="16M")
    parser.add_argument("--repeat", type=int, default=3)
    args = parse_args(parser, argv, {"small": "16k", "large": "256k", "repeat": 1})
    small, large = size(args.small), size(args.large)
    print(f"{'shape':<22} {'small s/MiB':>12} {'large s/MiB':>12} {'large ms':>9} {'ratio':>6}")
    worst = ("", 0.0)
    worst_ratio = 0.0
    small_shapes, large_shapes = worst_shapes(small), worst_shapes(large)
    for name in small_shapes:
        a = cost(small_shapes[name], args.repeat) / (len(small_shapes[name]) / MIB)
        seconds = cost(large_shapes[name], args.repeat)
        b = seconds / (len(large_shapes[name]) / MIB)
        ratio = b / a if a > 0 else 0.0
        print(f"{name:<22} {a:>12.4f} {b:>12.4f} {seconds * 1000:>9.0f} {ratio:>6.2f}")
        if max(a, b) > worst[1]:
            worst = (name, max(a, b))
        worst_ratio = max(worst_ratio, ratio)
    print(f"shapes: worst {worst[1]:.3f} s/MiB ({worst[0]}); worst ratio {worst_ratio:.2f}")
    emit(
        "shapes",
        {
            "worst_shape": worst[0],
            "worst_s_per_mib": round(worst[1], 4),
            "worst_large_to_small_ratio": round(worst_ratio, 2),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
