"""MLLP sender: deliver one HL7 v2 message over TCP (optionally TLS) and check its ACK.

Framing follows MLLP release 2 (HL7 v2 Appendix C); the ACK rules follow HL7 v2.5 chapter 2
(:mod:`inturn.worker.hl7.expect`). One connection is kept open between messages
(:class:`inturn.worker.senders.mllp_link.Link`); it is dropped after any failure and on
cancellation (the worker bounds each attempt with ``asyncio.timeout``). A reply is matched to
the message it answers by MSA-2, and nothing heard before a message was written is read as its
answer, so a second ACK or a late one can neither answer nor fail the next message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from inturn.worker.hl7.ack import ACK_CODES, Ack, parse_ack
from inturn.worker.hl7.errors import AckParseError, HeaderError
from inturn.worker.hl7.expect import due, enhanced
from inturn.worker.hl7.header import Header, parse_header
from inturn.worker.hl7.mllp import Frame, FrameTooLarge, Garbage
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.senders import shape
from inturn.worker.senders import tls as tls_node
from inturn.worker.senders.base import DeliveryError, FailureCause
from inturn.worker.senders.kind import SecretFile, SenderConfig, SenderKind
from inturn.worker.senders.mllp_link import Closed, Link
from inturn.worker.senders.tls import TlsConfig, client_context
from inturn.worker.spec.openapi import Schema, boolean, integer, obj, string

log = logging.getLogger("inturn.senders.mllp")

#: Longest detail kept from a receiver's MSA-3 / ERR text, in characters.
DETAIL_MAX_CHARS = 500
#: Largest acknowledgement accepted unless the destination says otherwise, in bytes.
DEFAULT_MAX_ACK_BYTES = 1024 * 1024

_NACK_OUTCOMES: dict[str, FailureCause] = {"AE": "AE", "AR": "AR", "CE": "CE", "CR": "CR"}
#: A block's start and end (HL7 v2 Appendix C); :func:`_checked` has made sure that the
#: payload holds neither byte, so it is framed without the second scan ``mllp.frame`` makes.
_SB = b"\x0b"
_TRAILER = b"\x1c\r"


def _error_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, OSError) else f"{type(exc).__name__}: {text}"


def _nack_detail(ack: Ack) -> str:
    parts = [part for part in (ack.text, ack.error_text) if part]
    if ack.error_code and not ack.error_text:
        parts.append(f"error {ack.error_code}")
    detail = " / ".join(dict.fromkeys(parts)) or "no text"
    return detail[:DETAIL_MAX_CHARS]


def unsendable(payload: bytes) -> str | None:
    """Why no MLLP receiver could ever be sent ``payload``, or None when it can be.

    MLLP has no escaping: a start-block byte (0x0B) or end-block byte (0x1C) inside the message
    would end or garble its block at any receiver; and a message without a readable MSH-10 can
    never be matched to an acknowledgement. No retry changes either, so ingest refuses such a
    message at the door for an MLLP destination, and a stored one fails as ``unsendable``.
    """
    return _checked(payload)[1]


def _checked(payload: bytes) -> tuple[Header | None, str | None]:
    """``payload``'s MSH and None, or None and why it is unsendable (:func:`unsendable`)."""
    for byte, name in ((0x0B, "start-block"), (0x1C, "end-block")):
        if byte in payload:
            return None, (
                f"the message contains the MLLP {name} byte 0x{byte:02X}, which MLLP cannot carry"
            )
    try:
        return parse_header(payload), None
    except HeaderError as exc:
        return None, f"the message has no usable MSH: {exc}"


class _Answered(Exception):
    """Internal: the exchange ended before any reply byte (a candidate for the fresh retry)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class MllpSender:
    """Implements :class:`inturn.worker.senders.base.Sender` over MLLP.

    Args:
        config: host, port, optional TLS, ``max_ack_bytes`` (the largest reply accepted) and
            ``always_wait_for_ack``.
        timeout_seconds: optional bound of one ``send`` (connect, write, read the ACKs); when
            it passes, ``DeliveryError("timeout", ...)`` is raised. None (the default) leaves
            bounding to the caller, whose cancellation is handled the same way.

    **Which answers are awaited** (:mod:`inturn.worker.hl7.expect`, HL7 v2.5 chapter 2): in
    original mode one ACK (AA, or CA from receivers that answer so); in enhanced mode the
    accept ACK when MSH-15 is AL or SU and the application ACK when MSH-16 is AL or SU, in any
    order. When none is due (NE, ER) the message is delivered once written and flushed, unless
    ``always_wait_for_ack`` is set: then one positive ACK of either level is awaited.

    **Matching**: only a frame whose MSA-2 equals the message's MSH-10 answers it. Whatever
    arrived before the message was written is thrown away unread; a frame that names a message
    sent earlier on the same connection (a second ACK, a late answer) is thrown away too, with
    a log line when it is negative. Neither counts against the message being sent.

    **Failures** raise :class:`DeliveryError` with outcome

    * ``AE`` / ``AR`` / ``CE`` / ``CR``: the receiver's code; detail is MSA-3 and ERR text;
    * ``controlIdMismatch``: MSA-2 names a message this connection never carried (an AE/AR
      with an empty MSA-2 is reported as its code instead);
    * ``invalidAck``: an oversized or unparseable reply, an MSA-1 outside table 0008, or bytes
      outside any block on a connection's first exchange (on a reused connection they may be
      the tail of an earlier exchange and are ignored);
    * ``unsendable``, without sending anything: see :func:`unsendable`;
    * ``unreachable``: refused, DNS or TLS handshake failure, or the connection reset or
      closed before any byte of a reply (nothing was heard about this message); a timeout
      before the message was written too;
    * ``connection``: the connection broke in the middle of a reply, or after a first answer
      when a second one was due.

    **A reused connection that fails before any reply byte arrives** (the receiver closed it
    after its last ACK, common in older engines) is replaced by a fresh one and the message is
    written again at once, inside the same ``send``: no attempt is counted and no backoff paid.
    This happens at most once per ``send``, so a receiver gets at most one duplicate.

    Every failure, and a cancellation, drops the connection; otherwise it is kept for the next
    message (extra answers on it are told apart by MSA-2, as above).
    """

    def __init__(self, config: MllpSenderConfig, *, timeout_seconds: float | None = None) -> None:
        self.config = config
        self.timeout_seconds = timeout_seconds
        self._ssl = client_context(config.tls) if config.tls is not None else None
        self._link: Link | None = None
        #: Connections opened so far (for tests and diagnostics).
        self.connections_opened = 0
        #: Sends repeated at once on a fresh connection after a reused one failed (diagnostics).
        self.fresh_retries = 0
        #: The last positive ACK that answered the message of the last ``send`` (its MSA-1 and
        #: MSA-2, for ``inturn send``'s report); None when none was awaited or it failed.
        self.last_ack: Ack | None = None
        #: The last send began writing its message (see ``Sender.written``).
        self.written = False

    def describe(self) -> str:
        """``mllp://host:port``, or ``mllps://host:port`` with TLS."""
        scheme = "mllps" if self.config.tls is not None else "mllp"
        return f"{scheme}://{self.config.host}:{self.config.port}"

    @property
    def connected(self) -> bool:
        """Whether a connection is held for the next message and the peer has not closed it."""
        link = self._link
        if link is None:
            return False
        link.leftovers()
        return link.usable

    async def send(self, payload: bytes, *, item_id: int = 0) -> None:
        """Send one message and wait for the ACKs it asks for; see the class docstring.

        ``payload`` is sent as :func:`inturn.worker.hl7.terminators.normalise_terminators`
        makes it: a message terminated by CR goes byte for byte.

        Raises:
            DeliveryError: the receiver did not accept it, or the transport failed.
        """
        self.last_ack = None
        self.written = False
        try:
            header, data = self._prepare(payload)
            if self.timeout_seconds is None:  # no bound of our own: the caller's
                await self._deliver(header, data)
                return
            try:
                async with asyncio.timeout(self.timeout_seconds):
                    await self._deliver(header, data)
            except TimeoutError:
                if not self.written:
                    raise DeliveryError(
                        "unreachable", f"not connected within {self.timeout_seconds}s"
                    ) from None
                raise DeliveryError("timeout", f"no ACK within {self.timeout_seconds}s") from None
        except BaseException:
            # Whatever went wrong (including cancellation), the stream may still carry a
            # reply meant for this message: never reuse it.
            self._abort()
            raise

    async def _deliver(self, header: Header, data: bytes) -> None:
        control_id = header.control_id.strip()
        awaited: set[str] = set(due(header, True)) if enhanced(header) else {"any"}
        if not awaited and self.config.always_wait_for_ack:
            awaited = {"any"}
        link = await self._connection()
        reused = link.exchanges > 0
        try:
            await self._exchange(link, control_id, data, awaited)
        except _Answered as exc:
            if not reused:
                raise DeliveryError("unreachable", exc.detail) from None
            # A kept connection the receiver had already given up: not this message's fault.
            self._abort()
            self.fresh_retries += 1
            log.info(
                "%s: kept connection failed before any reply (%s); sending again on a new one",
                self.describe(),
                exc.detail,
            )
            link = await self._connection()
            try:
                await self._exchange(link, control_id, data, awaited)
            except _Answered as again:
                raise DeliveryError("unreachable", again.detail) from None

    @staticmethod
    def _prepare(payload: bytes) -> tuple[Header, bytes]:
        """The message's MSH and its framed bytes.

        Raises:
            DeliveryError: ``unsendable`` (see :func:`unsendable`); nothing was sent.
        """
        header, reason = _checked(payload)  # the MSH is read once, the bytes scanned once
        if header is None:
            raise DeliveryError("unsendable", reason or "unsendable")
        return header, b"".join((_SB, normalise_terminators(payload), _TRAILER))  # one copy

    async def _exchange(self, link: Link, control_id: str, data: bytes, awaited: set[str]) -> None:
        """Write ``data`` on ``link`` and read until every awaited level has answered.

        ``awaited`` holds ``accept``, ``application`` or ``any`` (either level); empty means
        delivered once flushed.

        Raises:
            _Answered: the connection failed before any byte of a reply to this message.
            DeliveryError: any other failure.
        """
        self.written = True
        try:
            await link.write(data, control_id)
        except OSError as exc:
            raise _Answered(_error_text(exc)) from None
        seen: set[str] = set()
        replied = False
        while not awaited <= seen:
            heard = await link.next()
            if isinstance(heard, Closed):
                if replied or heard.mid_frame:
                    where = "in the middle of the reply" if heard.mid_frame else "before replying"
                    raise DeliveryError(
                        "connection",
                        heard.error or f"the receiver closed the connection {where}",
                    )
                raise _Answered(heard.error or "the receiver closed the connection before replying")
            event = heard.event
            if isinstance(event, Garbage):
                if link.exchanges > 1:
                    # Possibly the tail of an earlier exchange: never an answer, never a fault.
                    log.info("%s: ignored %d bytes outside any block", self.describe(), event.count)
                    continue
                raise DeliveryError(
                    "invalidAck",
                    f"the reply is not MLLP-framed ({event.count} bytes outside a block)",
                )
            if isinstance(event, FrameTooLarge):
                raise DeliveryError("invalidAck", f"the reply is larger than {event.limit} bytes")
            assert isinstance(event, Frame)
            try:
                ack = parse_ack(event.payload)
            except AckParseError as exc:
                raise DeliveryError("invalidAck", str(exc)) from None
            level = self._level(link, ack, control_id)
            if level is None:
                continue  # an answer to an earlier message on this connection
            replied = True
            self.last_ack = ack
            seen.add(level)
            seen.add("any")
            if level == "application":
                seen.add("accept")  # an application ACK implies the message was accepted

    def _level(self, link: Link, ack: Ack, control_id: str) -> str | None:
        """The level a positive ``ack`` answers for this message, or None for an answer to an
        earlier one. Raises DeliveryError for a negative or mismatched answer to this one."""
        acked = ack.control_id.strip()
        if ack.code not in ACK_CODES:
            raise DeliveryError("invalidAck", f"unknown acknowledgment code {ack.code[:10]!r}")
        if acked != control_id and acked and acked in list(link.sent)[:-1]:
            if not ack.accepted:
                log.warning(
                    "%s: late %s for MSH-10 %r, sent earlier on this connection: %s",
                    self.describe(),
                    ack.code,
                    acked[:40],
                    _nack_detail(ack),
                )
            return None
        if ack.accepted:
            if acked != control_id:
                raise DeliveryError("controlIdMismatch", self._mismatch(acked, control_id))
            return "accept" if ack.code == "CA" else "application"
        if acked and acked != control_id:
            raise DeliveryError("controlIdMismatch", self._mismatch(acked, control_id))
        raise DeliveryError(_NACK_OUTCOMES[ack.code], _nack_detail(ack))

    @staticmethod
    def _mismatch(acked: str, control_id: str) -> str:
        return f"MSA-2 {acked[:40]!r} does not match MSH-10 {control_id[:40]!r}"

    async def probe(self) -> bool:
        """Whether the receiver accepts a connection now (TCP, and the TLS handshake where
        configured), sending nothing; the connection is kept for the next send. Bound it with
        a timeout: a connect may hang as long as the network lets it."""
        try:
            await self._connection()
        except DeliveryError:
            return False
        return True

    async def _connection(self) -> Link:
        link = self._link
        if link is not None:
            link.leftovers()  # nothing heard before the next write can answer it
            if link.usable:
                return link
            # The peer closed (or reset) the idle connection: start afresh rather than lose
            # an attempt to it.
            self._abort()
        host, port = self.config.host, self.config.port
        server_hostname = None
        if self._ssl is not None:
            server_hostname = (self.config.tls and self.config.tls.server_name) or host
        try:
            link = await Link.open(
                host,
                port,
                self.config.max_ack_bytes,
                ssl_context=self._ssl,
                server_hostname=server_hostname,
            )
        except (OSError, EOFError) as exc:  # refused, DNS, TLS handshake (ssl.SSLError is one)
            raise DeliveryError(
                "unreachable", f"connect {host}:{port}: {_error_text(exc)}"
            ) from None
        self.connections_opened += 1
        self._link = link
        return link

    def _abort(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.abort()

    async def close(self) -> None:
        """Close the held connection, if any. The sender stays usable: ``send`` reconnects."""
        link, self._link = self._link, None
        if link is not None:
            await link.close()


# --- the kind: spec.sender.mllp ---------------------------------------------------------------


@dataclass(frozen=True)
class MllpSenderConfig(SenderConfig):
    """An MLLP receiver: host, port (1-65535), optional TLS, maximum ACK size in bytes.

    ``always_wait_for_ack``: wait for one positive ACK even when the message's MSH-15/MSH-16
    ask for none (for receivers that answer every message whatever it asks for).
    """

    host: str
    port: int
    tls: TlsConfig | None = None
    max_ack_bytes: int = DEFAULT_MAX_ACK_BYTES
    always_wait_for_ack: bool = False


class MllpKind(SenderKind[MllpSenderConfig]):
    """``spec.sender.mllp``: deliver over MLLP, optionally in TLS (:class:`MllpSender`)."""

    name = "mllp"
    config_type = MllpSenderConfig

    def spec_schema(self) -> Schema:
        """Host, port, optional TLS (a Secret by reference) and the largest ACK accepted."""
        return self._node(tls_node.spec_schema())

    def worker_schema(self) -> Schema:
        """As :meth:`spec_schema`, with the TLS files as paths."""
        return self._node(tls_node.worker_schema())

    @staticmethod
    def _node(tls: Schema) -> Schema:
        return obj(
            {
                "host": string(
                    "Host name or IP address of the receiver.",
                    max_length=253,
                    min_length=1,
                    pattern=shape.HOST_PATTERN,
                ),
                "port": integer("TCP port of the receiver.", minimum=1, maximum=65535),
                "tls": tls,
                "maxAckBytes": integer(
                    "Largest acknowledgement accepted, in bytes.",
                    minimum=256,
                    maximum=16 * 1024 * 1024,
                    default=DEFAULT_MAX_ACK_BYTES,
                ),
                "alwaysWaitForAck": boolean(
                    "Wait for an acknowledgement even when the message's MSH-15/MSH-16 ask for"
                    " none (NE, ER), for receivers that answer every message regardless.",
                    default=False,
                ),
            },
            required=("host", "port"),
            description=(
                "Deliver over MLLP (HL7 v2 Minimal Lower Layer Protocol), optionally in TLS."
            ),
        )

    def render(self, spec: Mapping[str, Any], secret_file: SecretFile) -> dict[str, Any]:
        """Host, port and ACK limit as they are; TLS Secret keys as paths."""
        out = {
            "host": spec["host"],
            "port": spec["port"],
            "maxAckBytes": spec["maxAckBytes"],
            "alwaysWaitForAck": spec["alwaysWaitForAck"],
        }
        tls = tls_node.render(spec.get("tls"), secret_file)
        return out if tls is None else {**out, "tls": tls}

    def from_dict(self, doc: Mapping[str, Any]) -> MllpSenderConfig:
        """The configuration of a rendered ``mllp`` node."""
        return MllpSenderConfig(
            host=doc["host"],
            port=int(doc["port"]),
            tls=tls_node.from_dict(doc.get("tls")),
            max_ack_bytes=int(doc.get("maxAckBytes", DEFAULT_MAX_ACK_BYTES)),
            always_wait_for_ack=bool(doc.get("alwaysWaitForAck", False)),
        )

    def to_dict(self, config: MllpSenderConfig) -> dict[str, Any]:
        """The rendered ``mllp`` node of ``config``."""
        out: dict[str, Any] = {
            "host": config.host,
            "port": config.port,
            "maxAckBytes": config.max_ack_bytes,
            "alwaysWaitForAck": config.always_wait_for_ack,
        }
        tls = tls_node.to_dict(config.tls)
        return out if tls is None else {**out, "tls": tls}

    def secret_keys(self, spec: Mapping[str, Any]) -> dict[str, set[str]]:
        """The TLS Secret's keys, if any."""
        return tls_node.secret_keys(spec.get("tls"))

    def summary(self, spec: Mapping[str, Any]) -> str:
        """``mllp://host:port``, or ``mllps://host:port`` with TLS."""
        scheme = "mllps" if spec.get("tls") is not None else "mllp"
        return f"{scheme}://{spec.get('host')}:{spec.get('port')}"

    def files(self, config: MllpSenderConfig) -> Iterable[str]:
        """The TLS PEM files."""
        return config.tls.files() if config.tls is not None else []

    def secret_files(self, config: MllpSenderConfig) -> Iterable[str]:
        """The TLS client key."""
        return [config.tls.key_file] if config.tls is not None and config.tls.key_file else []

    def problems(self, node: Mapping[str, Any]) -> list[str]:
        """The host (IDNA, labels, NUL) and the TLS server name
        (:mod:`inturn.worker.senders.shape`)."""
        return [
            *shape.field("host", shape.host_problem(node.get("host"))),
            *tls_node.problems(node.get("tls")),
        ]

    def build(self, config: MllpSenderConfig) -> MllpSender:
        """An :class:`MllpSender` (loads the TLS files now).

        Raises:
            ValueError: :meth:`problems` finds one (or the TLS files are unusable).
        """
        self.refuse_shape(config)
        return MllpSender(config)

    def refusal(self, payload: bytes) -> str | None:
        """See :func:`unsendable`."""
        return unsendable(payload)


KIND = MllpKind()
