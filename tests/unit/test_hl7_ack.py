"""ACK building (original and enhanced mode, ERR layouts, rejects) and ACK parsing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import hl7
import pytest

from inturn.worker.hl7.ack import (
    Ack,
    AckErrorDetail,
    ack_code,
    ack_mode,
    build_ack,
    build_reject,
    new_control_id,
    parse_ack,
)
from inturn.worker.hl7.errors import AckParseError
from inturn.worker.hl7.header import parse_header, second_header

NOW = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
ADT = b"MSH|^~\\&|SAPP|SFAC|RAPP|RFAC|20240101||ADT^A01^ADT_A01|MSG00001|T|2.5.1\rPID|1||42\r"


def segments(ack: bytes) -> list[list[str]]:
    assert ack.endswith(b"\r")
    return [s.split("|") for s in ack.decode("latin-1").split("\r")[:-1]]


def test_build_ack_original_mode_layout() -> None:
    ack = build_ack(parse_header(ADT), "AA", control_id="ACK1", now=NOW)
    assert ack == (
        b"MSH|^~\\&|RAPP|RFAC|SAPP|SFAC|20240506070809+0000||ACK^A01^ACK|ACK1|T|2.5.1\r"
        b"MSA|AA|MSG00001\r"
    )


def test_build_ack_with_text_and_error_v25_layout() -> None:
    error = AckErrorDetail(207, user_message="database unavailable")
    ack = build_ack(parse_header(ADT), "AE", text="not stored", error=error, now=NOW)
    msh, msa, err = segments(ack)
    assert msa == ["MSA", "AE", "MSG00001", "not stored"]
    assert err == [
        "ERR",
        "",
        "",
        "207^Application internal error^HL70357",
        "E",
        "",
        "",
        "",
        "database unavailable",
    ]
    assert len(msh[9]) == 20
    assert msh[9] != "MSG00001"


def test_err_location_and_custom_text() -> None:
    error = AckErrorDetail(101, text="MSH-10 missing", location="MSH^1^10")
    _, _, err = segments(build_ack(parse_header(ADT), "AR", error=error, now=NOW))
    assert err == ["ERR", "", "MSH^1^10", "101^MSH-10 missing^HL70357", "E"]


def test_err_for_v24_and_earlier_also_fills_err1() -> None:
    msg = ADT.replace(b"|2.5.1\r", b"|2.3\r")
    _, _, err = segments(build_ack(parse_header(msg), "AE", error=AckErrorDetail(100), now=NOW))
    assert err[1] == "^^^100&Segment sequence error&HL70357"
    assert err[3] == "100^Segment sequence error^HL70357"


def test_ack_echoes_custom_delimiters() -> None:
    msg = b"MSH#$*@%#S#SF#R#RF#2024##ORU$R01$ORU_R01#ID|7#P#2.4\r"
    header = parse_header(msg)
    ack = build_ack(header, "AE", text="a#b$c", error=AckErrorDetail(207), now=NOW)
    lines = ack.decode().split("\r")
    assert lines[0].startswith("MSH#$*@%#R#RF#S#SF#20240506070809+0000##ACK$R01$ACK#")
    assert lines[1] == "MSA#AE#ID|7#a@F@b@S@c"
    assert (
        lines[2]
        == "ERR#$$$207%Application internal error%HL70357##207$Application internal error$HL70357#E"
    )
    parsed = parse_ack(ack)
    assert parsed == Ack("AE", "ID|7", "a#b$c", "207", "Application internal error")


def test_ack_echoes_five_encoding_characters() -> None:
    header = parse_header(b"MSH|^~\\&#|S|F|R|G|2024||ADT^A04|X|P|2.7\r")
    ack = build_ack(header, "AA", now=NOW)
    assert ack.startswith(b"MSH|^~\\&#|R|G|S|F|")
    assert b"|ACK^A04^ACK|" in ack


def test_ack_defaults_for_missing_version_and_processing_id() -> None:
    header = parse_header(b"MSH|^~\\&|||||||ACK|1\r")
    msh, msa = segments(build_ack(header, "AA", control_id="Z", now=NOW))
    assert msh[8:] == ["ACK", "Z", "P", "2.5.1"]
    assert msa == ["MSA", "AA", "1"]


def test_naive_now_is_written_without_offset() -> None:
    msh, _ = segments(build_ack(parse_header(ADT), "AA", now=datetime(2024, 1, 2, 3, 4, 5)))
    assert msh[6] == "20240102030405"
    tz = timezone(timedelta(hours=-5))
    msh, _ = segments(build_ack(parse_header(ADT), "AA", now=datetime(2024, 1, 2, tzinfo=tz)))
    assert msh[6] == "20240102000000-0500"


def test_text_is_escaped_and_reduced_to_ascii() -> None:
    _, msa = segments(build_ack(parse_header(ADT), "AE", text="x|y^z\\w\nnext é", now=NOW))
    assert msa[3:] == ["x\\F\\y\\S\\z\\E\\w next ?"]


def test_unknown_code_is_refused() -> None:
    with pytest.raises(ValueError):
        build_ack(parse_header(ADT), "OK")


def test_new_control_ids_are_short_and_unique() -> None:
    ids = {new_control_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 20 for i in ids)


def test_python_hl7_reads_our_ack() -> None:
    ack = build_ack(parse_header(ADT), "AE", text="t", error=AckErrorDetail(207), now=NOW)
    message = hl7.parse(ack.decode().rstrip("\r"))
    assert str(message["MSA.F1"]) == "AE"
    assert str(message["MSA.F2"]) == "MSG00001"
    assert str(message.segment("MSH")[9]) == "ACK^A01^ACK"
    assert str(message["ERR.F3.R1.C1"]) == "207"


@pytest.mark.parametrize(
    ("msh15", "msh16", "mode", "codes"),
    [
        ("", "", "original", ("AA", "AE", "AR")),
        ("AL", "", "enhanced", ("CA", "CE", "CR")),
        ("", "NE", "enhanced", ("CA", "CE", "CR")),
        ("NE", "AL", "enhanced", ("CA", "CE", "CR")),
    ],
)
def test_ack_mode_and_codes(msh15: str, msh16: str, mode: str, codes: tuple[str, ...]) -> None:
    header = parse_header(f"MSH|^~\\&|A|B|C|D|2024||ADT^A01|1|P|2.5|||{msh15}|{msh16}\r".encode())
    assert ack_mode(header) == mode
    assert (
        ack_code(header, "accept"),
        ack_code(header, "error"),
        ack_code(header, "reject"),
    ) == codes


def test_build_reject_without_any_msh() -> None:
    ack = build_reject(b"\x00garbage", "AR", AckErrorDetail(100), control_id="R1", now=NOW)
    msh, msa, err = segments(ack)
    assert msh == [
        "MSH",
        "^~\\&",
        "",
        "",
        "",
        "",
        "20240506070809+0000",
        "",
        "ACK",
        "R1",
        "P",
        "2.5.1",
    ]
    assert msa == ["MSA", "AR", "", "Segment sequence error"]
    assert err == ["ERR", "", "", "100^Segment sequence error^HL70357", "E"]


def test_build_reject_uses_what_could_be_read() -> None:
    payload = b"MSH#$*@%#S#SF#R#RF#2024##ADT$A08#ID5#P#2.5\r"  # fine apart from MSH-9 code
    broken = payload.replace(b"ADT$A08", b"$A08")
    ack = build_reject(broken, "AR", AckErrorDetail(101, user_message="MSH-9.1"), now=NOW)
    lines = ack.decode().split("\r")
    assert lines[0].startswith("MSH#$*@%#R#RF#S#SF#")
    assert "#ACK$A08$ACK#" in lines[0]
    assert lines[1] == "MSA#AR#ID5#Required field missing"
    assert parse_ack(ack).error_text == "MSH-9.1"


def test_build_reject_with_explicit_text_and_enhanced_code() -> None:
    ack = build_reject(ADT, "CR", AckErrorDetail(200), text="no ADT here", now=NOW)
    assert parse_ack(ack) == Ack("CR", "MSG00001", "no ADT here", "200", "Unsupported message type")


def test_a_reject_echoes_at_most_the_bounded_lengths() -> None:
    """A peer's 5,000-character MSH-10 (refused) or MSH-3 is echoed cut to MSH-10's (199) and
    HD's (227) lengths, never inside an escape sequence: an ACK stays small."""
    long_id = "I" * 197 + "\\F\\" + "J" * 5000
    payload = f"MSH|^~\\&|{'S' * 5000}|SF|R|RF|2024||ADT^A01|{long_id}|P|2.5\r".encode()
    ack = build_reject(payload, "AR", AckErrorDetail(104), now=NOW)
    msh, msa, _ = segments(ack)
    assert msa[2] == "I" * 197  # the open escape at 198-199 is not cut into
    assert msh[4] == "S" * 227 and len(ack) < 1000
    header = parse_header(payload.replace(long_id.encode(), b"ID1"))
    assert segments(build_ack(header, "AA", now=NOW))[0][4] == "S" * 227


@pytest.mark.parametrize(
    ("payload", "found"),
    [
        (b"MSH|^~\\&|A||||||ADT^A01|1|P|2.5\rPID|1\r", None),
        (b"\r\nMSH|^~\\&|A||||||ADT^A01|1|P|2.5\rPID|1\r", None),  # leading CR LF skipped
        (b"MSH|^~\\&|A||||||ADT^A01|1|P|2.5\rMSH|^~\\&|B\r", 32),
        (b"MSH|^~\\&|A||||||ADT^A01|1|P|2.5\r\nMSH|^~\\&|B\r", 33),
        (b"MSH#^~\\&#A######ADT^A01#1\rMSH|x\rMSH#y\r", 32),  # its own field separator
        (b"MSH|^~\\&|A||||||ADT^A01|1|P|2.5\rOBX|1|TX|||MSH|x\r", None),  # not a segment
    ],
)
def test_second_header_finds_a_second_message_in_a_frame(payload: bytes, found: int | None) -> None:
    assert second_header(payload, parse_header(payload).delimiters) == found


@pytest.mark.parametrize("separator", [b"\r", b"\n", b"\r\n"])
def test_parse_ack_tolerates_separators_and_missing_final_cr(separator: bytes) -> None:
    reply = separator.join([b"MSH|^~\\&|R|RF|S|SF|2024||ACK^A01|A9|P|2.5", b"MSA|AA|MSG00001"])
    assert parse_ack(reply) == Ack("AA", "MSG00001")
    assert parse_ack(b"\xef\xbb\xbf\r\n" + reply + separator).accepted


def test_parse_ack_reads_text_and_err8_first() -> None:
    reply = (
        b"MSH|^~\\&|R|RF|S|SF|2024||ACK|A9|P|2.5\r"
        b"MSA|ae|MSG00001|Patient \\T\\ visit unknown\r"
        b"ERR||PID^1^3|204^Unknown key identifier^HL70357|E||||No such patient\r"
        b"ERR|||207^second^HL70357|E\r"
    )
    assert parse_ack(reply) == Ack(
        "AE", "MSG00001", "Patient & visit unknown", "204", "No such patient"
    )


def test_parse_ack_err3_text_when_no_err8() -> None:
    reply = b"MSH|^~\\&|||||||ACK|1\rMSA|AR|M1\rERR|||101^Required field missing^HL70357|E\r"
    ack = parse_ack(reply)
    assert (ack.code, ack.error_code, ack.error_text) == ("AR", "101", "Required field missing")
    assert not ack.accepted


def test_parse_ack_v23_err1() -> None:
    reply = b"MSH|^~\\&|||||||ACK|1|P|2.3\rMSA|AE|M1|bad\rERR|PID^1^3^204&Unknown key&HL70357\r"
    ack = parse_ack(reply)
    assert (ack.text, ack.error_code, ack.error_text) == ("bad", "204", "Unknown key")


def test_parse_ack_decodes_utf8_text() -> None:
    reply = "MSH|^~\\&|||||||ACK|1\rMSA|AE|M1|Échec\r".encode()
    assert parse_ack(reply).text == "Échec"


def test_parse_ack_without_err_or_text() -> None:
    ack = parse_ack(b"MSH|^~\\&|||||||ACK|1\rMSA|CA\r")
    assert ack == Ack("CA", "", None, None, None)
    assert ack.accepted


@pytest.mark.parametrize(
    "reply",
    [
        b"",
        b"garbage",
        b"MSA|AA|1\r",
        b"MSH|^~\\&|||||||ACK|1\r",
        b"MSH|^~\\&|||||||ACK|1\rMSA||1\r",
        b"MSH|^~\\&|||||||ACK|1\rMSA\r",
        b"MSH\rMSA|AA|1\r",
    ],
)
def test_parse_ack_errors(reply: bytes) -> None:
    with pytest.raises(AckParseError):
        parse_ack(reply)


@pytest.mark.parametrize("control", [b"\x0b", b"\x1c", b"\n", b"\x00", b"\x7f"])
def test_an_ack_echoes_no_control_byte_of_the_message(control: bytes) -> None:
    """MLLP has no escaping: a 0x0B or 0x1C copied from the peer's MSH would frame our ACK
    wrongly, an LF would split its segment; every echoed field leaves them out."""
    payload = (
        b"MSH|^~\\&|A" + control + b"|F|R|RF|20240101||ADT^A01" + control + b"|C" + control
        + b"1|P|2.5.1" + control + b"\rPID|1\r"
    )  # fmt: skip
    ack = build_reject(payload, "AR", AckErrorDetail(102), control_id="R1", now=NOW)
    assert [b for b in ack if b < 0x20 or b == 0x7F] == [0x0D, 0x0D, 0x0D]
    if control == b"\n":
        return  # an LF ends the MSH segment for a lenient reader: nothing past it is echoed
    msh, msa = ack.split(b"\r")[:2]
    assert msh.split(b"|")[2:4] == [b"R", b"RF"] and msh.split(b"|")[11] == b"2.5.1"
    assert msa == b"MSA|AR|C1|Data type error"
