"""Where the benchmarks' messages come from: the shared samples, or messages the project makes.

The benchmarks send the shapes of real feeds when they can: the sample messages in
``../shared/samples/hl7`` beside the repository, or the folder ``INTURN_SAMPLES`` names, read in
place (never copied into the repository). A fresh clone has neither; the benchmarks then send
the demo's made-up patients (``examples/demo_messages.py``: admissions, lab results and
discharges of an imaginary hospital) so that they still run, and each says which it used: a line
on standard output and the ``messages`` figure of its JSON line (``"samples"`` or
``"made-up"``). Figures from made-up messages are smaller messages' figures: compare only runs
of the same source.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
#: The shared samples beside the repository (``../shared/samples/hl7``).
SHARED_SAMPLES = BENCH_DIR.parents[1] / "shared" / "samples" / "hl7"
#: The ``messages`` figure of a run that sent the shared samples.
FROM_SAMPLES = "samples"
#: The ``messages`` figure of a run that sent the demo's made-up messages.
MADE_UP = "made-up"
#: Patients of the made-up feed (about four messages each).
MADE_UP_PATIENTS = 40


def samples_dir() -> Path:
    """The samples folder: ``$INTURN_SAMPLES`` if set, else ``../shared/samples/hl7``."""
    value = os.environ.get("INTURN_SAMPLES")
    return Path(value) if value else SHARED_SAMPLES


@dataclass(frozen=True)
class Messages:
    """The messages a benchmark sends, in a stable order, and where they came from."""

    source: str  # FROM_SAMPLES or MADE_UP
    items: list[tuple[str, bytes]]  # (name, the message's bytes), sorted by name
    where: str  # one line for people: which messages, from where

    def describe(self) -> str:
        """``messages: <where>``, the line each benchmark prints before its figures."""
        return f"messages: {self.where}"


def load(directory: Path | None = None) -> Messages:
    """The ``*.hl7`` files of ``directory`` (default :func:`samples_dir`), or, when it has none
    (or does not exist), the demo's made-up feed of :data:`MADE_UP_PATIENTS` patients.

    Never raises for a missing folder: that is a fresh clone, and it is said in ``where``.
    """
    folder = directory if directory is not None else samples_dir()
    files = sorted(folder.glob("*.hl7")) if folder.is_dir() else []
    if files:
        items = [(p.name, p.read_bytes()) for p in files]
        return Messages(FROM_SAMPLES, items, f"{len(items)} samples from {folder}")
    sys.path.insert(0, str(BENCH_DIR.parent / "examples"))
    try:
        from demo_messages import generate  # examples/demo_messages.py
    finally:
        sys.path.pop(0)
    feed = generate(patients=MADE_UP_PATIENTS)
    items = [(f"{m.control_id}-{m.kind}.hl7", m.payload) for m in feed]
    return Messages(
        MADE_UP,
        items,
        f"{len(items)} made-up messages (examples/demo_messages.py): no samples under {folder}"
        " (set INTURN_SAMPLES to use real-world shaped ones)",
    )
