"""ForStatus and the fold of reply codes, as tables over every AIRIMP code the issue lists."""

from __future__ import annotations

import pytest

from inturn.worker.reservations.codes import (
    KNOWN_CODES,
    Attention,
    fold,
    for_status,
    is_status_code,
    office_queue,
)

# code -> reason on the owner's worklist (None: silent)
FOR_STATUS = {
    "HK": None,
    "KK": "confirmed",
    "KL": "confirmed",
    "UC": "refused",
    "UN": "refused",
    "US": "waitlisted",
    "UU": "waitlisted",
    "NO": "refused",
    "HL": None,
    "HX": "refused",
    "HN": None,
    "NN": None,
    "LL": None,
    "SS": None,
    "DK": None,
    "DW": None,
    "XX": None,
    "XK": None,
    "XL": None,
    "GK": None,
    "PN": None,
    "RR": None,
    "HQ": None,
    "TK": "schedule-change",
    "TL": "schedule-change",
    "TN": "schedule-change",
    "WK": "schedule-change",
    "WL": "schedule-change",
    "WN": "schedule-change",
    "SC": "schedule-change",
    "DL": "refused",
}

FOLDS = {
    "KK": "HK",
    "KL": "HK",
    "US": "HL",
    "UU": "HL",
    "TL": "HL",
    "TK": "HK",
    "TN": "HN",
    # refusals keep the reply code: nothing is held
    "UC": "UC",
    "UN": "UN",
    "NO": "NO",
    "HX": "HX",
    # holding and action codes stay what they are
    "HK": "HK",
    "HL": "HL",
    "HN": "HN",
    "NN": "NN",
    "XX": "XX",
    "WK": "WK",
    "SC": "SC",
    "DL": "DL",
}


@pytest.mark.parametrize(("code", "reason"), sorted(FOR_STATUS.items()))
def test_for_status(code: str, reason: str | None) -> None:
    got = for_status(code, "FRA1A0")
    if reason is None:
        assert got is None
    else:
        assert got == Attention(queue="office-fra1a0", reason=reason)  # type: ignore[arg-type]


def test_the_table_covers_exactly_the_listed_codes() -> None:
    assert set(FOR_STATUS) == KNOWN_CODES


@pytest.mark.parametrize("code", ["ZZ", "Q1", "HA", "OX", "99"])
def test_an_unknown_code_is_for_review_never_a_refusal(code: str) -> None:
    assert for_status(code, "MUC1A0") == Attention(office_queue("MUC1A0"), "review")


@pytest.mark.parametrize(("code", "held"), sorted(FOLDS.items()))
def test_fold(code: str, held: str) -> None:
    assert fold(code) == held


def test_fold_of_an_unknown_code_keeps_it() -> None:
    assert fold("ZZ") == "ZZ"


@pytest.mark.parametrize(("text", "ok"), [("KK", True), ("K", False), ("kk", False), ("K1", True)])
def test_status_code_shape(text: str, ok: bool) -> None:
    assert is_status_code(text) is ok
