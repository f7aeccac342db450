"""Kind 5 (pure part): what MLLP can never carry, and that it fails at once by default."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from inturn.worker.drain.retry import decide
from inturn.worker.senders.mllp import unsendable
from inturn.worker.senders.registry import refusal
from inturn.worker.spec.config import AckPolicy, RetryPolicy

MSH = b"MSH|^~\\&|A|B|C|D|2026||ADT^A01|ID1|P|2.5.1\r"
BODY = st.binary(max_size=80).map(lambda b: b.replace(b"\x0b", b"").replace(b"\x1c", b""))


@given(BODY)
def test_a_message_without_block_bytes_can_be_sent(body: bytes) -> None:
    assert unsendable(MSH + body) is None
    assert refusal("mllp", MSH + body) is None


@given(BODY, BODY, st.sampled_from([b"\x0b", b"\x1c"]))
def test_a_block_byte_anywhere_makes_it_unsendable_over_mllp(
    before: bytes, after: bytes, byte: bytes
) -> None:
    payload = MSH + before + byte + after
    reason = unsendable(payload)
    assert reason is not None and f"0x{byte[0]:02X}" in reason
    assert refusal("mllp", payload) == reason
    assert refusal("http", payload) is None  # HTTP carries any bytes
    assert refusal(None, payload) is None  # unknown kind: nothing refused


def test_no_readable_msh_is_unsendable() -> None:
    assert "MSH" in (unsendable(b"MSH|^~\\&|A|B|C|D|2026||ADT^A01||P|2.5\r") or "")
    assert unsendable(b"PID|1\r") is not None


def test_unsendable_follows_max_attempts_unless_the_ack_policy_says() -> None:
    forever, three = RetryPolicy(max_attempts=0), RetryPolicy(max_attempts=3)
    assert decide("unsendable", 1, three, AckPolicy()).give_up  # at once, not at the third
    assert not decide("unsendable", 1, forever, AckPolicy()).give_up  # 0 never lets one go
    assert decide("unsendable", 1, forever, AckPolicy(unsendable="fail")).give_up
    assert not decide("unsendable", 1, three, AckPolicy(unsendable="retry")).give_up
    assert not decide("invalidAck", 1, forever, AckPolicy()).give_up
