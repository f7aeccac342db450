"""The benchmarks' messages on a fresh clone: without the shared samples they send the demo's
made-up patients, every one usable, and say so (``bench/corpus.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import corpus  # noqa: E402
import delivery  # noqa: E402
import ingest  # noqa: E402


def test_an_empty_or_missing_folder_gives_the_made_up_feed(tmp_path: Path) -> None:
    for folder in (tmp_path, tmp_path / "absent"):
        source = corpus.load(folder)
        assert source.source == corpus.MADE_UP
        assert len(source.items) >= 3 * corpus.MADE_UP_PATIENTS  # admission, result(s), discharge
        assert source.items[0][0] == "DEMO00001-A01.hl7"
        assert f"no samples under {folder}" in source.describe()
        templates, skipped = delivery.load_templates(source)
        assert skipped == []
        assert len(templates) == len(source.items)
        assert len(ingest.templates(source)) == len(source.items)
        # the same seed: the same feed each run, so that two runs compare
        assert corpus.load(folder).items == source.items


def test_a_folder_of_messages_is_used_as_it_is(tmp_path: Path) -> None:
    made_up = corpus.load(tmp_path / "none").items[:3]
    for name, data in made_up:
        (tmp_path / name).write_bytes(data)
    source = corpus.load(tmp_path)
    assert source.source == corpus.FROM_SAMPLES
    assert source.items == sorted(made_up)
    assert source.where == f"3 samples from {tmp_path}"


def test_the_folder_comes_from_inturn_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INTURN_SAMPLES", str(tmp_path))
    assert corpus.samples_dir() == tmp_path
    monkeypatch.delenv("INTURN_SAMPLES")
    assert corpus.samples_dir() == corpus.SHARED_SAMPLES
