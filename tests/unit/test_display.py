"""Kind 7: text from outside is shown with control characters escaped (worker/text/display.py)."""

from __future__ import annotations

import json
import logging
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inturn.worker.text import logs
from inturn.worker.text.display import printable, printable_values


def unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Zl", "Zp") or 0x202A <= ord(ch) <= 0x202E


@given(st.text())
def test_nothing_unsafe_survives(text: str) -> None:
    shown = printable(text)
    assert not any(unsafe(ch) for ch in shown)
    assert len(shown.splitlines()) <= 1


@given(st.text().filter(lambda t: not any(unsafe(ch) for ch in t)))
def test_safe_text_is_unchanged(text: str) -> None:
    assert printable(text) == text


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("Bad\r\n12:00:00 INFO forged", "Bad\\r\\n12:00:00 INFO forged"),
        ("tab\there", "tab\\there"),
        ("nul\x00 esc\x1b[31m del\x7f c1\x85", "nul\\x00 esc\\x1b[31m del\\x7f c1\\x85"),
        ("line\u2028sep\u2029", "line\\u2028sep\\u2029"),
        ("rtl\u202eevil", "rtl\\u202eevil"),
        ("Müller \\X0D\\ kept", "Müller \\X0D\\ kept"),
    ],
)
def test_examples(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_values_of_a_json_document() -> None:
    doc = {"lastError": "AE: a\nb", "attempts": 2, "ids": ["x\ry"], "none": None}
    assert printable_values(doc) == {
        "lastError": "AE: a\\nb",
        "attempts": 2,
        "ids": ["x\\ry"],
        "none": None,
    }


@pytest.mark.parametrize("json_logs", [False, True])
def test_a_log_argument_cannot_start_a_line(
    capsys: pytest.CaptureFixture[str], json_logs: bool
) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("INFO", json_logs=json_logs)
        logging.getLogger("inturn.worker").warning(
            "attempt failed (%s)", "AE: Bad\r\n12:00:00 INFO    inturn.worker: forged"
        )
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    message = json.loads(err)["message"] if json_logs else err
    assert "Bad\\r\\n12:00:00" in message
