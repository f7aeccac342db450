"""Property tests: framing under arbitrary splits, no undocumented errors on arbitrary bytes,
and ACK round trips with arbitrary encoding characters."""

from __future__ import annotations

import contextlib
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from inturn.worker.hl7.ack import AckErrorDetail, build_ack, build_reject, parse_ack
from inturn.worker.hl7.errors import AckParseError, HeaderError
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.mllp import Frame, FrameReader, FrameTooLarge, frame
from inturn.worker.hl7.pid import patient_identifiers

payloads = st.binary(max_size=300).map(lambda b: b.replace(b"\x1c", b""))
filler = st.binary(max_size=4).map(lambda b: bytes(c for c in b if c in b"\x00\r\n \t"))


@st.composite
def stream_and_cuts(draw: st.DrawFn) -> tuple[list[bytes], bytes, list[int]]:
    messages = draw(st.lists(payloads, max_size=6))
    data = b""
    for message in messages:
        framed = frame(message)
        if draw(st.booleans()):
            framed = framed[:-1]  # no CR after EB
        data += draw(filler) + framed
    data += draw(filler)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=20)))
    return messages, data, cuts


@given(stream_and_cuts())
def test_any_split_of_a_stream_yields_the_same_frames(
    case: tuple[list[bytes], bytes, list[int]],
) -> None:
    messages, data, cuts = case
    reader = FrameReader(1000)
    events = []
    start = 0
    for cut in [*cuts, len(data)]:
        events += reader.feed(data[start:cut])
        start = cut
    assert events == [Frame(m) for m in messages]
    assert not reader.mid_frame


@given(st.lists(st.binary(max_size=200), max_size=10), st.integers(1, 64))
def test_frame_reader_never_raises_and_bounds_frames(chunks: list[bytes], limit: int) -> None:
    reader = FrameReader(limit)
    for chunk in chunks:
        for event in reader.feed(chunk):
            if isinstance(event, Frame):
                assert len(event.payload) <= limit
            if isinstance(event, FrameTooLarge):
                assert reader.failed


header_like = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda tail: b"MSH" + tail, st.binary(max_size=200)),
    st.builds(lambda tail: b"MSH|^~\\&|" + tail, st.binary(max_size=200)),
    st.text(alphabet="MSH|^~\\&#\r\n AD01x", max_size=80).map(str.encode),
)


@given(header_like)
def test_arbitrary_bytes_raise_only_documented_errors(data: bytes) -> None:
    try:
        header = parse_header(data)
    except HeaderError as exc:
        assert exc.code in (100, 101, 102)
    else:
        assert header.control_id.strip()
        assert header.message_type.code
        build_ack(header, "AA")
    with contextlib.suppress(AckParseError):
        parse_ack(data)
    parse_ack(build_reject(data, "AR", AckErrorDetail(100)))
    assert isinstance(patient_identifiers(data), list)


usable = list(string.punctuation)


@st.composite
def delimiters(draw: st.DrawFn) -> str:
    count = draw(st.sampled_from([5, 6]))  # field separator + 4 or 5 encoding characters
    chars = draw(st.lists(st.sampled_from(usable), min_size=count, max_size=count, unique=True))
    return "".join(chars)


printable = st.text(alphabet=[chr(c) for c in range(0x20, 0x7F)], max_size=40)


@given(
    delimiters(),
    st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=20),
    st.sampled_from(["AA", "AE", "AR", "CA", "CE", "CR"]),
    printable,
    st.one_of(st.none(), st.integers(0, 300)),
    printable,
    st.sampled_from(["2.3", "2.4", "2.5.1", "2.7", ""]),
)
@settings(max_examples=300)
def test_build_then_parse_round_trips(
    delims: str,
    control_id: str,
    code: str,
    text: str,
    error_code: int | None,
    user_message: str,
    version: str,
) -> None:
    fs, enc = delims[0], delims[1:]
    cs = enc[0]
    message = fs.join(
        ["MSH", enc, "S", "SF", "R", "RF", "2024", "", f"ADT{cs}A01", control_id, "P", version]
    )
    header = parse_header(message.encode() + b"\r")
    assert header.control_id == control_id
    assert header.encoding_characters == enc
    error = None if error_code is None else AckErrorDetail(error_code, user_message=user_message)
    ack = build_ack(header, code, text=text, error=error)
    assert ack.startswith(f"MSH{fs}{enc}{fs}R{fs}RF{fs}S{fs}SF{fs}".encode())
    parsed = parse_ack(ack)
    assert parsed.code == code
    assert parsed.control_id == control_id
    assert parsed.text == (text.strip() or None)
    if error_code is None:
        assert parsed.error_code is None
    else:
        assert parsed.error_code == str(error_code)
        assert parsed.error_text is not None
        if user_message.strip():
            assert parsed.error_text == user_message.strip()
