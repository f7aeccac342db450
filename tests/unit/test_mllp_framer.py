"""MLLP framing: frame() and the sans-I/O FrameReader."""

from __future__ import annotations

import pytest

from inturn.worker.hl7.mllp import (
    CR,
    EB,
    SB,
    Frame,
    FrameReader,
    FrameTooLarge,
    Garbage,
    frame,
)

MSG = b"MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5\rPID|1||42\r"


def frames(events: list[object]) -> list[bytes]:
    return [e.payload for e in events if isinstance(e, Frame)]


def test_constants_are_the_mllp_bytes() -> None:
    assert (SB, EB, CR) == (0x0B, 0x1C, 0x0D)


def test_frame_wraps_payload() -> None:
    assert frame(b"abc") == b"\x0babc\x1c\r"


def test_frame_refuses_end_block_byte_in_payload() -> None:
    with pytest.raises(ValueError, match="0x1C"):
        frame(b"ab\x1ccd")


def test_one_frame() -> None:
    reader = FrameReader(1024)
    assert reader.feed(frame(MSG)) == [Frame(MSG)]
    assert not reader.mid_frame


def test_pipelined_frames_in_one_feed() -> None:
    reader = FrameReader(1024)
    data = frame(b"one") + frame(b"two") + frame(b"three")
    assert reader.feed(data) == [Frame(b"one"), Frame(b"two"), Frame(b"three")]


def test_frame_split_byte_by_byte() -> None:
    reader = FrameReader(1024)
    events: list[object] = []
    data = frame(MSG) + frame(b"second")
    for i in range(len(data)):
        events += reader.feed(data[i : i + 1])
    assert events == [Frame(MSG), Frame(b"second")]


def test_mid_frame_tracks_an_open_block() -> None:
    reader = FrameReader(1024)
    assert not reader.mid_frame
    reader.feed(b"\x0bMSH|")
    assert reader.mid_frame
    assert reader.buffered_bytes == 4
    reader.feed(b"x\x1c")
    assert not reader.mid_frame


def test_missing_final_cr_is_accepted_at_end_block() -> None:
    reader = FrameReader(1024)
    assert reader.feed(b"\x0bone\x1c") == [Frame(b"one")]
    # The CR that arrives late is swallowed; the next frame without a CR is fine too.
    assert reader.feed(b"\r\x0btwo\x1c\x0bthree\x1c") == [Frame(b"two"), Frame(b"three")]


def test_filler_between_frames_is_ignored() -> None:
    reader = FrameReader(1024)
    data = b"\x00\x00\r\n \t\x0c" + frame(b"a") + b"\x00\n\r\n" + frame(b"b") + b"\x00"
    assert reader.feed(data) == [Frame(b"a"), Frame(b"b")]


def test_garbage_before_start_block_is_dropped_and_reported() -> None:
    reader = FrameReader(1024)
    assert reader.feed(b"HELLO\x00" + frame(b"a")) == [Garbage(5), Frame(b"a")]


def test_start_block_inside_a_frame_is_payload() -> None:
    reader = FrameReader(1024)
    assert reader.feed(b"\x0ba\x0bb\x1c\r") == [Frame(b"a\x0bb")]


def test_empty_frame() -> None:
    assert FrameReader(10).feed(b"\x0b\x1c\r") == [Frame(b"")]


def test_frame_at_the_limit_is_accepted() -> None:
    reader = FrameReader(5)
    assert reader.feed(frame(b"12345")) == [Frame(b"12345")]


def test_frame_over_the_limit_fails_before_end_block() -> None:
    reader = FrameReader(5)
    assert reader.feed(b"\x0b123") == []
    assert reader.feed(b"456") == [FrameTooLarge(5)]
    assert reader.failed
    assert not reader.mid_frame
    # In the error state everything is ignored.
    assert reader.feed(frame(b"ok")) == []


def test_frames_before_an_oversized_one_are_still_delivered() -> None:
    reader = FrameReader(5)
    assert reader.feed(frame(b"ok") + b"\x0b123456789") == [Frame(b"ok"), FrameTooLarge(5)]


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FrameReader(0)


def test_empty_feed() -> None:
    assert FrameReader(10).feed(b"") == []


# --- a stray 0x1C inside a message ---------------------------------------------------------------


def test_an_end_block_byte_followed_by_more_message_is_content() -> None:
    """EB followed by a byte other than CR, SB or filler is inside the message: the block goes
    on to the next EB that ends it (the caller refuses a message with a 0x1C in it)."""
    stray = b"MSH|^~\\&|A|B|C|D|||ORU^R01|1|P|2.5\rOBX|1|ST|X||ab\x1ccd\r"
    assert frames(FrameReader(1 << 20).feed(b"\x0b" + stray + b"\x1c\r")) == [stray]
    # the same byte by byte: each EB is at the end of a read, so the block ends there
    reader = FrameReader(1 << 20)
    events = [e for byte in b"\x0b" + stray + b"\x1c\r" for e in reader.feed(bytes([byte]))]
    assert frames(events) == [stray[: stray.index(b"\x1c")]]
    garbage = [e for e in events if isinstance(e, Garbage)]
    assert garbage[0] == Garbage(1, after_bare_end=True)  # "c", then "d" and the last EB
    assert sum(g.count for g in garbage) == 3 and len(events) == 4


def test_a_block_without_its_cr_still_ends_before_filler_and_the_next_block() -> None:
    for between in (b"", b"\n", b"\x00 \n", b"\r\n"):
        reader = FrameReader(1 << 20)
        events = reader.feed(b"\x0b" + MSG + b"\x1c" + between + b"\x0b" + MSG + b"\x1c")
        assert frames(events) == [MSG, MSG] and len(events) == 2, between
        # a CR only late: stray bytes after it are ordinary garbage
        assert reader.feed(b"\rjunk") == [Garbage(4)]


def test_an_end_block_byte_at_the_end_of_a_read_ends_the_block() -> None:
    """A peer that leaves out the CR and waits for its answer is answered."""
    reader = FrameReader(1 << 20)
    assert frames(reader.feed(b"\x0b" + MSG + b"\x1c")) == [MSG]
    assert frames(reader.feed(b"\x0b" + MSG + b"\x1c\r")) == [MSG]


def test_a_dropped_block_goes_on_past_a_stray_end_block_byte() -> None:
    reader = FrameReader(1 << 20)
    reader.feed(b"\x0bMSH|^~\\&|A")
    reader.drop(4)
    events = reader.feed(b"|x\x1cy|z\x1c\r")
    assert [(type(e).__name__, getattr(e, "size", None)) for e in events] == [("Dropped", 16)]
