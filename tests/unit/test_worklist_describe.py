"""Worklist details read as sentences (inturn.worker.worklist.describe)."""

from __future__ import annotations

from inturn.worker.worklist.describe import plain, sentence


def test_a_given_up_message() -> None:
    item = {
        "queue": "delivery-failed",
        "reason": "ack-ar",
        "details": {
            "destination": "ward/lab",
            "channel": "adt",
            "controlId": "C1",
            "messageType": "ORU^R01",
            "attempts": 1,
            "outcome": "AR",
        },
    }
    assert sentence(item) == (
        "ORU^R01 C1 to ward/lab was given up after 1 attempt (last outcome AR). Resend it once"
        " the cause is fixed, or clear this."
    )


def test_a_stuck_destination_says_since_when() -> None:
    item = {
        "queue": "delivery-stuck",
        "reason": "destination-stuck",
        "details": {
            "headId": 7,
            "headEnqueuedAt": "2026-12-01T08:00:00+00:00",
            "waitingSeconds": 1800,
            "stuckAfterSeconds": 900,
            "headAttempts": 4,
            "suspended": True,
        },
    }
    assert sentence(item) == (
        "The head (item 7, queued 2026-12-01 08:00 UTC) has waited 30m, past the threshold of"
        " 15m, after 4 attempt(s). Delivery is suspended (spec.suspend)."
    )
    item["details"] = {**item["details"], "suspended": False, "lanes": 8}
    assert sentence(item).endswith(
        "after 4 attempt(s). The destination has 8 lanes: this message holds its patient's later"
        " messages (and the merges and barriers that name it); other patients go on."
    )


def test_a_partner_reply_and_an_unanswered_segment() -> None:
    refused = {
        "queue": "office-fra1a0",
        "reason": "refused",
        "details": {"code": "UC", "previous": "HN", "status": "UC", "carrier": "LH"},
    }
    assert sentence(refused) == "LH answered UC: rebook (status HN is now UC)."
    silent = {
        "queue": "office-fra1a0",
        "reason": "unanswered",
        "details": {
            "carrier": "LH",
            "flight": "400",
            "status": "HN",
            "requestedAt": "2026-11-30T08:00:00+00:00",
        },
    }
    assert sentence(silent) == "LH 400 is still HN: no answer since 2026-11-30 08:00 UTC."


def test_unknown_reasons_and_missing_fields_fall_back_to_a_plain_list() -> None:
    assert sentence({"queue": "q", "reason": "new", "details": {"carrierCode": "LH"}}) == (
        "carrier code LH."
    )
    assert sentence({"queue": "delivery-failed", "reason": "x", "details": {"a": 1}}) == "a 1."
    assert plain({"withdrawn": [1, 2], "cancelled": True, "empty": None}) == (
        "withdrawn 1, 2, cancelled yes."
    )
    assert sentence({"queue": "q", "reason": "r"}) == ""
