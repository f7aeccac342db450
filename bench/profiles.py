"""Benchmark receiver profiles (``spec.profile``): what shaping one message costs the worker.

The transform (:func:`inturn.worker.hl7.profile.transform`) runs right before a message is
framed, once per send. Target (issue 42): under 50 us for a 13 KB message with five rules on the
development machine. It also times the charset rule alone and all eight rule kinds together,
and the cost without a profile (:func:`inturn.worker.hl7.profile.shaped` with None: one test).

The message: the sample nearest 13,000 bytes (``../shared/samples/hl7`` or ``INTURN_SAMPLES``),
else a made-up ORU^R01 of about 13 KB (said on the first line).

    python bench/profiles.py [--repeat 2000]

Needs no database. Prints figures and asserts nothing; the last line is the JSON of the figures
(microseconds per message, best of five runs of ``--repeat`` transforms each).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from corpus import load
from figures import emit, parse_args

from inturn.worker.hl7.profile import compile_profile, shaped, transform

TARGET_BYTES = 13_000
TARGET_US = 50.0

FIVE_RULES = {
    "set": {"MSH-5": "LIS_NORTH", "MSH-6": "NORTH"},
    "removeSegments": ["Z*", "NTE"],
    "clear": ["PID-13"],
    "truncate": {"OBX-5": 200},
    "maps": [{"field": "OBX-3.1", "table": {"GLU": "2345-7"}, "otherwise": "keep"}],
}
CHARSET = {
    "charset": {"to": "ISO-8859-1", "unmappable": "transliterate", "whenUndeclared": "UTF-8"}
}
EVERY_KIND = {
    **FIVE_RULES,
    "copy": {"MSH-3": "MSH-4"},
    "sequenceNumbers": True,
    **CHARSET,
}


def made_up() -> bytes:
    """An ORU^R01 of about 13 KB: a header, a patient, 60 results with notes."""
    lines = [
        "MSH|^~\\&|LAB|SOUTH|LIS|SOUTH|20260101120000||ORU^R01^ORU_R01|MSG0001|P|2.5.1",
        "PID|1||12345^^^SOUTH^MR||Doe^Jane^Q||19800101|F|||1 Main St^^Town^ST^12345||555-0100",
        "OBR|1|ORD1|FIL1|GLU^Glucose^L|||20260101110000",
    ]
    for i in range(60):
        lines.append(f"OBX|{i + 1}|NM|GLU^Glucose^L||{90 + i}|mg/dL|70-99|N|||F|||20260101115500")
        lines.append(f"NTE|{i + 1}||Result reviewed and verified by the laboratory, run {i}")
    lines.append("ZXY|1|local data")
    return ("\r".join(lines) + "\r").encode()


def per_message_us(fn: Callable[[], object], repeat: int) -> float:
    """Best of five runs of ``repeat`` calls, in microseconds per call."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, time.perf_counter() - started)
    return best / repeat * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000, help="transforms per timed run")
    args = parse_args(parser, argv, {"repeat": 20})
    corpus = load()
    if corpus.source == "samples":
        name, message = min(corpus.items, key=lambda item: abs(len(item[1]) - TARGET_BYTES))
        where = f"sample {name}"
    else:
        name, message = "made-up", made_up()
        where = "a made-up ORU^R01 (no samples found)"
    print(f"message: {where}, {len(message):,} bytes")
    figures: dict[str, float] = {}
    for label, spec in (
        ("five_rules_us", FIVE_RULES),
        ("charset_only_us", CHARSET),
        ("every_kind_us", EVERY_KIND),
    ):
        profile = compile_profile(spec)
        assert profile is not None
        transform(message, profile, 1)  # warm: compiled patterns, codec lookups
        figures[label] = round(
            per_message_us(lambda p=profile: transform(message, p, 1), args.repeat), 1
        )
        print(f"{label:>16}: {figures[label]:8.1f} us per message")
    figures["no_profile_us"] = round(per_message_us(lambda: shaped(message, None), args.repeat), 3)
    print(f"{'no_profile_us':>16}: {figures['no_profile_us']:8.3f} us per message")
    verdict = "meets" if figures["five_rules_us"] < TARGET_US else "misses"
    print(f"five rules {verdict} the target of {TARGET_US:g} us")
    emit(
        "profiles",
        {
            "message_bytes": len(message),
            "messages": corpus.source,
            **figures,
            "target_us": TARGET_US,
        },
    )


if __name__ == "__main__":
    main()
