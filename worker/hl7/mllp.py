"""MLLP framing: wrap messages in blocks and recover them from a byte stream, without I/O.

Source: HL7 v2 Appendix C / "HL7 MLLP release 2" (the Minimal Lower Layer Protocol). A block is

    <SB 0x0B> payload <EB 0x1C> <CR 0x0D>

:class:`FrameReader` is a sans-I/O parser in the style of h11: the caller feeds it whatever
bytes arrived and gets events back. It is deliberately tolerant of what real peers send:

* several blocks in one read (pipelining) and one block split over many reads;
* a missing CR after EB: the block ends at EB when what follows it is filler up to the next
  SB or the end of what has arrived; an EB followed by any other byte is content (a message
  with a stray 0x1C inside it, which MLLP cannot carry: the caller refuses it), never a cut;
  when a read ends right after such an EB the block ends there, and bytes that then arrive
  before any SB are reported as :class:`Garbage` with ``after_bare_end`` set;
* NUL, whitespace, CR, LF and form feeds between blocks are ignored silently;
* any other byte between blocks is dropped and reported as :class:`Garbage`;
* an SB inside a block is payload data (only EB ends a block).
"""

from __future__ import annotations

from dataclasses import dataclass

SB = 0x0B  #: start block (vertical tab)
EB = 0x1C  #: end block (file separator)
CR = 0x0D  #: carriage return: ends the block, and each HL7 segment

_SB = bytes([SB])
_EB = bytes([EB])
_TRAILER = bytes([EB, CR])
#: Bytes ignored without comment between blocks.
_FILLER = frozenset(b"\x00\t\n\x0c\r ")
_FILLER_BYTES = bytes(sorted(_FILLER))


def frame(payload: bytes) -> bytes:
    """Wrap ``payload`` in one MLLP block: ``SB + payload + EB + CR``.

    Raises:
        ValueError: ``payload`` contains the end-block byte 0x1C, which no receiver could
            tell apart from the end of the block (MLLP has no escaping).
    """
    if _EB in payload:
        raise ValueError("the payload contains the MLLP end-block byte 0x1C")
    return _SB + payload + _TRAILER


@dataclass(frozen=True)
class Frame:
    """A complete block. ``payload`` is its content without SB, EB and the trailing CR."""

    payload: bytes


@dataclass(frozen=True)
class FrameTooLarge:
    """A block grew past ``limit`` bytes of payload.

    The reader is then in an error state and ignores further input: the caller should answer
    with a reject (AR) if it can and close the connection.
    """

    limit: int


@dataclass(frozen=True)
class Garbage:
    """``count`` bytes outside any block that were neither SB nor filler; they were dropped.

    ``after_bare_end``: they came right after a block that ended in EB without its CR at the
    end of a read, so that block may have been a message cut at a stray 0x1C inside it (the
    caller should say so louder than for other stray bytes)."""

    count: int
    after_bare_end: bool = False


@dataclass(frozen=True)
class Dropped:
    """A complete block whose content the caller chose to drop (:meth:`FrameReader.drop`);
    ``head`` is what was kept of its start (enough for its MSH), ``size`` its payload length."""

    head: bytes
    size: int


Event = Frame | FrameTooLarge | Garbage | Dropped

#: What follows an EB in the bytes at hand (:func:`_after_eb`).
_ENDS = 0  #: CR, or filler up to an SB: the block ends at the EB
_UNSEEN = 1  #: nothing, or only filler, up to the end of what has arrived: it ends there too
_CONTENT = 2  #: another byte: the EB is inside the message


def _after_eb(data: bytes, pos: int) -> int:
    """Classify what follows an EB at ``pos - 1`` in ``data`` (one of ``_ENDS``, ``_UNSEEN``,
    ``_CONTENT``); past :data:`_LOOK` bytes of filler the block is taken as ended."""
    if pos >= len(data):
        return _UNSEEN
    if data[pos] == CR:
        return _ENDS
    rest = bytes(data[pos : pos + _LOOK]).lstrip(_FILLER_BYTES)
    if not rest:
        return _UNSEEN if pos + _LOOK >= len(data) else _ENDS
    return _ENDS if rest[0] == SB else _CONTENT


#: How far past an EB the reader looks for what follows it.
_LOOK = 4096


class FrameReader:
    """Recover MLLP blocks from a byte stream.

    Args:
        max_frame_bytes: the largest payload accepted, in bytes; a longer block produces
            :class:`FrameTooLarge` as soon as the limit is passed (before EB arrives).

    Raises:
        ValueError: ``max_frame_bytes`` is not positive.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._in_frame = False
        self._failed = False
        self._dropping = False
        self._dropped = 0
        #: the last block ended at EB without CR at the end of a read, no SB seen since
        self._bare_end = False

    @property
    def mid_frame(self) -> bool:
        """True between an SB and its EB: the peer owes the rest of a block.

        A caller can apply a read timeout while this is true, so a peer that stops in the
        middle of a block does not hold the connection forever.
        """
        return self._in_frame and not self._failed

    @property
    def dropping(self) -> bool:
        """True after :meth:`drop` until the dropped block ends."""
        return self._dropping

    def drop(self, keep: int) -> None:
        """Stop keeping the block being read: keep its first ``keep`` payload bytes, skip the
        rest as it arrives, and report it as :class:`Dropped` at its end. For a reader that
        cannot hold the block (no memory for it now) but must stay in step with the stream to
        answer it. Does nothing between blocks.
        """
        if not self._in_frame or self._failed:
            return
        if not self._dropping:
            self._dropped = len(self._buffer)
            self._dropping = True
        del self._buffer[keep:]

    @property
    def failed(self) -> bool:
        """True after :class:`FrameTooLarge`; the reader ignores everything from then on."""
        return self._failed

    @property
    def buffered_bytes(self) -> int:
        """Payload bytes of the unfinished block held so far."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Event]:
        """Consume ``data`` (any length, possibly empty) and return the events it completes.

        Events come in stream order. After a :class:`FrameTooLarge` every later call returns
        an empty list.
        """
        events: list[Event] = []
        if self._failed:
            return events
        if self._bare_end and data[:1] == b"\r":
            self._bare_end = False  # the CR was only late: the block had ended
        view = memoryview(data)
        pos = 0
        end = len(data)
        while pos < end:
            if self._in_frame:
                stop = data.find(_EB, pos)
                chunk_end = end if stop < 0 else stop
                if self._dropping:
                    self._dropped += chunk_end - pos
                    if self._dropped > self.max_frame_bytes:
                        self._fail(events)
                        return events
                    if stop < 0:
                        return events
                    if _after_eb(data, stop + 1) == _CONTENT:  # a stray 0x1C: still the block
                        self._dropped += 1
                        pos = stop + 1
                        continue
                    events.append(Dropped(bytes(self._buffer), self._dropped))
                    self._dropping = False
                    self._dropped = 0
                    self._buffer.clear()
                    self._in_frame = False
                    pos = stop + 1
                    continue
                room = self.max_frame_bytes - len(self._buffer)
                if chunk_end - pos > room:
                    self._fail(events)
                    return events
                self._buffer += view[pos:chunk_end]
                if stop < 0:
                    return events
                after = _after_eb(data, stop + 1)
                if after == _CONTENT:  # a stray 0x1C inside the message: part of it
                    if len(self._buffer) >= self.max_frame_bytes:
                        self._fail(events)
                        return events
                    self._buffer += _EB
                    pos = stop + 1
                    continue
                events.append(Frame(bytes(self._buffer)))
                self._buffer.clear()
                self._in_frame = False
                self._bare_end = after == _UNSEEN
                pos = stop + 1
            else:
                start = data.find(_SB, pos)
                stop = end if start < 0 else start
                # bytes that are neither SB nor filler, counted at C speed (not byte by byte)
                stray = len(bytes(data[pos:stop]).translate(None, _FILLER_BYTES))
                pos = stop
                if stray:
                    events.append(Garbage(stray, self._bare_end))
                if stray or pos < end:
                    self._bare_end = False
                if pos < end:
                    self._in_frame = True
                    pos += 1
        return events

    def _fail(self, events: list[Event]) -> None:
        self._failed = True
        self._in_frame = False
        self._dropping = False
        self._buffer = bytearray()
        events.append(FrameTooLarge(self.max_frame_bytes))
