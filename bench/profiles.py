"""Benchmark receiver profiles (``spec.profile``): what shaping one message costs the worker.

The transform (:func:`inturn.worker.hl7.profile.transform`) runs right before a message is
framed, once per send. Target (issue 42): under 50 us for a 13 KB message with five rules on the
development machine. It also times the charset rule alone and all eight rule kinds together,
and the cost without a profile (:func:`inturn.worker.hl7.profile.shaped` with None: one test).

The message: the sample nearest 13,000 bytes (``../shared/samples/hl7`` or ``INTURN_SAMPLES``),
else a made-up ORU^R01 of about 13 KB (said on the first line), as ingest stores it (terminators
made CR: :func:`inturn.worker.hl7.terminators.normalise_terminators`).

    python bench/profiles.py [--repeat 2000] [--runs 15] [--instructions]

Needs no database. Prints figures and asserts nothing; the last line is the JSON of the figures
(microseconds per message: the median of ``--runs`` runs of ``--repeat`` transforms each, and
the best run). ``--instructions`` also counts the CPU instructions one five-rule transform
executes, with ``valgrind --tool=callgrind`` when it is installed (the difference of two runs of
the same process, with 200 and with 0 transforms): a figure that a loaded machine does not move.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from corpus import load
from figures import emit, parse_args

from inturn.worker.hl7.profile import compile_profile, shaped, transform
from inturn.worker.hl7.terminators import normalise_terminators

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


def per_message_us(fn: Callable[[], object], repeat: int, runs: int) -> tuple[float, float]:
    """(median, best) of ``runs`` runs of ``repeat`` calls, in microseconds per call."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        for _ in range(repeat):
            fn()
        times.append((time.perf_counter() - started) / repeat * 1e6)
    return statistics.median(times), min(times)


def the_message() -> tuple[str, bytes, str]:
    """(where it came from, the message as stored, the corpus source)."""
    corpus = load()
    if corpus.source == "samples":
        name, message = min(corpus.items, key=lambda item: abs(len(item[1]) - TARGET_BYTES))
        return f"sample {name}", normalise_terminators(message), corpus.source
    return "a made-up ORU^R01 (no samples found)", made_up(), corpus.source


def instructions_per_transform() -> int | None:
    """CPU instructions one five-rule transform executes (callgrind, the difference of a run
    with 200 transforms and one with none); None without valgrind."""
    if shutil.which("valgrind") is None:
        return None
    counts = []
    for n in (0, 200):
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                __file__,
                "--transforms",
                str(n),
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        found = re.search(r"refs:\s+([\d,]+)", done.stderr)
        assert found is not None, done.stderr[-500:]
        counts.append(int(found.group(1).replace(",", "")))
    return (counts[1] - counts[0]) // 200


def transforms_only(n: int) -> None:
    """``n`` five-rule transforms of the message and nothing else (what callgrind counts)."""
    _, message, _ = the_message()
    profile = compile_profile(FIVE_RULES)
    assert profile is not None
    transform(message, profile, 1)
    for _ in range(n):
        transform(message, profile, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000, help="transforms per timed run")
    parser.add_argument("--runs", type=int, default=15, help="timed runs (the median is said)")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions with callgrind"
    )
    parser.add_argument("--transforms", type=int, default=None, help=argparse.SUPPRESS)
    args = parse_args(parser, argv, {"repeat": 20, "runs": 3})
    if args.transforms is not None:
        transforms_only(args.transforms)
        return
    where, message, source = the_message()
    print(f"message: {where}, {len(message):,} bytes as stored")
    figures: dict[str, float | int | None] = {}
    for label, spec in (
        ("five_rules_us", FIVE_RULES),
        ("charset_only_us", CHARSET),
        ("every_kind_us", EVERY_KIND),
    ):
        profile = compile_profile(spec)
        assert profile is not None
        transform(message, profile, 1)  # warm: compiled patterns, codec lookups
        median, best = per_message_us(
            lambda p=profile: transform(message, p, 1), args.repeat, args.runs
        )
        figures[label] = round(median, 1)
        figures[label.replace("_us", "_best_us")] = round(best, 1)
        print(f"{label:>16}: {median:8.1f} us per message (median; best {best:.1f})")
    median, _ = per_message_us(lambda: shaped(message, None), args.repeat, args.runs)
    figures["no_profile_us"] = round(median, 3)
    print(f"{'no_profile_us':>16}: {median:8.3f} us per message")
    five = figures["five_rules_us"]
    assert isinstance(five, float)
    verdict = "meets" if five < TARGET_US else "misses"
    print(f"five rules: median {five:.1f} us {verdict} the target (under {TARGET_US:g} us)")
    if args.instructions:
        counted = instructions_per_transform()
        figures["five_rules_instructions"] = counted
        said = f"{counted:,}" if counted is not None else "not counted (no valgrind)"
        print(f"five rules: {said} instructions per message (callgrind)")
    emit(
        "profiles",
        {
            "message_bytes": len(message),
            "messages": source,
            **figures,
            "target_us": TARGET_US,
        },
    )


if __name__ == "__main__":
    main()
