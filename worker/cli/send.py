"""``inturn send``: send HL7 v2 messages from files, folders or standard input, and say how each
was answered.

Targets: an MLLP peer (``--mllp HOST:PORT``, TLS with ``--tls`` and the ``--ca-file``,
``--cert-file``, ``--key-file`` and ``--server-name`` options) or inturn's HTTP ingest
(``--url .../channels/CHANNEL/messages``, a bearer token from ``--token`` or
``INTURN_SEND_TOKEN``; the same TLS options for ``https://``).

Every source is read and cut into messages (:mod:`inturn.worker.hl7.split`: MLLP-framed files,
plain files of one or more messages with CR, LF or CRLF terminators, or HL7 batch files, whose
messages go one by one) before anything is sent,
so a file that is not HL7 is a one-line error (exit 2) and nothing is sent. The messages then go
one at a time, in order (sources in the order given, a folder's files sorted by name), over one
connection, through the senders the workers use (:class:`inturn.worker.senders.mllp.MllpSender`
waits for exactly the ACKs the message asks for, HL7 v2.5 chapter 2, and matches them by MSA-2).

One line per message on stdout: ``MSA-1  MSH-10  source`` (``--`` for MSA-1 when no answer came;
then the cause), with the refusal's text after a colon; text from the peer is shown with its
control characters escaped. A last line on stderr counts the answers. Exit code 0 when every
message was accepted (AA; CA when the message asks only for an accept ACK), 1 otherwise, 2 for
bad arguments or unreadable sources. After a transport failure (connection refused or lost,
timeout) the remaining messages are not sent, and are counted as such; the failed one's line
says ``(not sent)`` when it was never written, or, when its connection closed before the ACK,
that it may have been stored (sending it again is a duplicate the receiver's window catches).
"""

from __future__ import annotations

import asyncio
import ssl
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import click

from inturn.worker.crypto.keyfiles import KeyFileExposed, check_key_file
from inturn.worker.hl7.ack import parse_ack
from inturn.worker.hl7.errors import AckParseError, HeaderError
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.split import SplitError, split_messages
from inturn.worker.ingest.listener import DEFAULT_MAX_FRAME_BYTES
from inturn.worker.senders.base import DeliveryError
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.senders.tls import TlsConfig, client_context
from inturn.worker.text.addresses import parse_address
from inturn.worker.text.display import printable

#: Failure causes after which the connection is gone: the rest is not sent.
TRANSPORT_CAUSES = frozenset({"connection", "unreachable", "timeout"})
#: Content type of an HL7 v2 message over HTTP, as ingest answers with it.
HL7_CONTENT_TYPE = "application/hl7-v2"
#: Most bytes of an HTTP answer read (an ACK is far smaller; the rest is not read).
MAX_ANSWER_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Outgoing:
    """One message to send and where it came from (``path`` or ``path#n`` for the n-th of a
    file holding several; ``-`` is standard input)."""

    source: str
    payload: bytes


@dataclass(frozen=True)
class Answer:
    """How one message was answered.

    Attributes:
        code: MSA-1 of the answer (``AA``, ``AE``, ...), or ``--`` when none came.
        accepted: AA, or CA where that is all the message asks for.
        detail: the refusal's text or the failure's cause (never the payload), or None.
        transport: the connection failed or timed out (what follows is not sent).
        written: the message went out (False: it never left, e.g. no connection was made).
    """

    code: str
    accepted: bool
    detail: str | None = None
    transport: bool = False
    written: bool = True


def control_id(payload: bytes) -> str:
    """MSH-10 of ``payload``, or ``?`` when its MSH cannot be read."""
    try:
        return parse_header(payload).control_id.strip()
    except HeaderError:
        return "?"


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
    return [path]


def read_sources(
    sources: Sequence[str], stdin: Iterable[bytes] | None, max_message_bytes: int
) -> list[Outgoing]:
    """Read every source and cut it into messages, in order.

    Args:
        sources: file or folder paths; ``-`` reads ``stdin``.
        stdin: the standard input's bytes (an iterable of chunks), used for ``-``.
        max_message_bytes: the largest message accepted.

    Raises:
        click.ClickException: a source cannot be read, or is not HL7 (its name and why).
    """
    out: list[Outgoing] = []
    for source in sources:
        if source == "-":
            named = [("-", b"".join(stdin or ()))]
        else:
            path = Path(source)
            if not path.exists():
                raise click.ClickException(f"{source}: no such file or folder")
            try:
                named = [(str(p), p.read_bytes()) for p in _files(path)]
            except OSError as exc:
                raise click.ClickException(f"{source}: {exc.strerror or exc}") from None
        for name, data in named:
            try:
                messages = split_messages(data, max_message_bytes=max_message_bytes).messages
            except SplitError as exc:
                raise click.ClickException(f"{name}: {exc}") from None
            for n, message in enumerate(messages, 1):
                out.append(Outgoing(name if len(messages) == 1 else f"{name}#{n}", message))
    return out


def _tls_config(
    ca_file: str | None, cert_file: str | None, key_file: str | None, server_name: str | None
) -> TlsConfig:
    return TlsConfig(
        ca_file=ca_file, cert_file=cert_file, key_file=key_file, server_name=server_name
    )


async def send_mllp(
    messages: Sequence[Outgoing],
    host: str,
    port: int,
    tls: TlsConfig | None,
    timeout: float,
    report: ReportFn,
) -> list[Answer]:
    """Send ``messages`` in order over one MLLP connection (TLS when ``tls`` is set).

    Each is bounded by ``timeout`` seconds (connect, write, read its ACKs). Stops after a
    transport failure. ``report`` is called with each message and its answer as it comes.
    """
    sender = MllpSender(MllpSenderConfig(host=host, port=port, tls=tls), timeout_seconds=timeout)
    answers: list[Answer] = []
    try:
        for message in messages:
            try:
                await sender.send(message.payload)
            except DeliveryError as exc:
                answer = _refused(exc, written=sender.written)
            else:
                ack = sender.last_ack
                if ack is None:
                    answer = Answer("--", True, "no ACK asked for (MSH-15/MSH-16)")
                else:
                    answer = Answer(ack.code, True)
            answers.append(answer)
            report(message, answer)
            if answer.transport:
                break
    finally:
        await sender.close()
    return answers


def _refused(exc: DeliveryError, written: bool = False) -> Answer:
    """The answer of a message the MLLP sender failed with: the peer's negative code, or the
    failure's cause in the detail. A transport failure says whether the message was written
    (``written``): one that never was is ``not sent``; one whose connection closed before its
    ACK may have been stored, and sending it again is a duplicate the receiver's window
    catches."""
    if exc.outcome in ("AE", "AR", "CE", "CR"):
        return Answer(exc.outcome, False, exc.detail)
    transport = exc.outcome in TRANSPORT_CAUSES
    if transport and written:
        cause = "closed before the ACK" if exc.outcome == "unreachable" else exc.outcome
        detail = (
            f"{cause}: {exc.detail} (sent: it may have been stored; sending it again is a"
            " duplicate the duplicate window catches)"
        )
    elif transport:
        return Answer("--", False, f"{exc.outcome}: {exc.detail} (not sent)", True, written=False)
    else:
        detail = f"{exc.outcome}: {exc.detail}"
    return Answer("--", False, detail, transport, written=written)


async def send_http(
    messages: Sequence[Outgoing],
    url: str,
    token: str | None,
    tls: TlsConfig | None,
    timeout: float,
    report: ReportFn,
) -> list[Answer]:
    """POST ``messages`` in order to ``url`` (inturn's HTTP ingest), one request each.

    The answer's body is the HL7 ACK ingest stores the message under; a 401 or 403 (no valid
    token, or one for another channel) has no ACK and is reported by its status. Stops after
    a transport failure or a refused credential.
    """
    import aiohttp  # the HTTP client is needed only here

    from inturn.worker.senders.outbound import client_session, read_bounded

    context: ssl.SSLContext | bool = True
    if url.startswith("https://"):
        context = client_context(tls or TlsConfig())
    headers = {"Content-Type": HL7_CONTENT_TYPE}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    answers: list[Answer] = []
    bound = aiohttp.ClientTimeout(total=timeout)
    server_hostname = tls.server_name if tls is not None else None
    async with client_session(timeout=bound) as session:
        for message in messages:
            try:
                async with session.post(
                    url,
                    data=message.payload,
                    headers=headers,
                    ssl=context,
                    server_hostname=server_hostname,
                    allow_redirects=False,
                ) as response:
                    body, _ = await read_bounded(response, MAX_ANSWER_BYTES)
                    status, reason = response.status, response.reason or ""
            except TimeoutError:
                answer = Answer("--", False, f"timeout: no answer within {timeout:g}s", True)
            except aiohttp.ClientConnectorError as exc:  # no connection: nothing went out
                answer = Answer("--", False, f"connection: {exc} (not sent)", True, written=False)
            except (aiohttp.ClientError, OSError) as exc:
                answer = Answer("--", False, f"connection: {exc}", True)
            else:
                answer = _http_answer(status, reason, body)
            answers.append(answer)
            report(message, answer)
            if answer.transport:
                break
    return answers


def _http_answer(status: int, reason: str, body: bytes) -> Answer:
    try:
        ack = parse_ack(body)
    except AckParseError:
        # 401/403 (or anything not from ingest) carry no ACK: the credential or the URL is
        # wrong for every message, so stop here
        return Answer("--", False, f"HTTP {status} {reason}".strip(), status in (401, 403, 404))
    detail = " ".join(t for t in (ack.text, ack.error_text) if t) or None
    return Answer(ack.code, ack.accepted, detail)


class ReportFn:
    """Prints one line per answer on stdout and keeps the counts (callable)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, message: Outgoing, answer: Answer) -> None:
        line = f"{answer.code}  {printable(control_id(message.payload))}  {message.source}"
        if answer.detail and not answer.accepted:
            line += f": {printable(answer.detail)}"
        click.echo(line)
        self.counts[answer.code] += 1


@click.command("send")
@click.argument("sources", nargs=-1, metavar="[FILE|FOLDER|-]...")
@click.option("--mllp", "mllp", metavar="[HOST:]PORT", help="Send over MLLP to this peer.")
@click.option(
    "--url",
    metavar="URL",
    help="POST to inturn's HTTP ingest: http(s)://HOST:PORT/channels/CHANNEL/messages.",
)
@click.option(
    "--token",
    envvar="INTURN_SEND_TOKEN",
    show_envvar=True,
    help="Bearer token for --url (`inturn token` makes one).",
)
@click.option("--tls", is_flag=True, help="MLLP over TLS (https:// URLs always use TLS).")
@click.option("--ca-file", type=click.Path(dir_okay=False), help="PEM CAs to trust (TLS).")
@click.option("--cert-file", type=click.Path(dir_okay=False), help="Client certificate (TLS).")
@click.option("--key-file", type=click.Path(dir_okay=False), help="Its key (TLS).")
@click.option("--server-name", help="Name to verify the server's certificate against (TLS).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds for each message: connect, send, and read its answer.",
)
@click.option(
    "--max-message-bytes",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_FRAME_BYTES,
    show_default=True,
    help="Largest message read from a source (ingest's --max-frame-bytes).",
)
def send_command(
    sources: tuple[str, ...],
    mllp: str | None,
    url: str | None,
    token: str | None,
    tls: bool,
    ca_file: str | None,
    cert_file: str | None,
    key_file: str | None,
    server_name: str | None,
    timeout: float,
    max_message_bytes: int,
) -> None:
    """Send HL7 v2 messages from files, folders or standard input (-), one line per answer.

    Files may hold one message or several, with CR, LF or CRLF segment terminators, be
    MLLP-framed, or be an HL7 batch (FHS/BHS: its messages are sent one by one). Every source
    is read before anything is sent: one that is not HL7 is a one-line error and nothing goes.
    Exit code 0 when every message was accepted (AA), 1 otherwise, 2 for an unreadable source.

    \b
      inturn send --mllp 127.0.0.1:2575 examples/messages/
      inturn send --url http://127.0.0.1:8080/channels/adt/messages message.hl7
    """
    if (mllp is None) == (url is None):
        raise click.UsageError("give exactly one of --mllp and --url")
    if not sources:
        if sys.stdin.isatty():
            raise click.UsageError("give files, folders, or - to read standard input")
        sources = ("-",)
    if url is not None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise click.BadParameter("an http:// or https:// URL", param_hint="--url")
    tls_config = None
    if key_file is not None:
        try:
            check_key_file(key_file, "--key-file")
        except (KeyFileExposed, OSError) as exc:
            raise click.ClickException(str(exc)) from None
    if tls or (url or "").startswith("https://") or any((ca_file, cert_file, key_file)):
        tls_config = _tls_config(ca_file, cert_file, key_file, server_name)
    stdin = iter(lambda: sys.stdin.buffer.read(65536), b"") if "-" in sources else None
    messages = read_sources(sources, stdin, max_message_bytes)
    if not messages:
        raise click.ClickException("no message found in " + ", ".join(sources))
    report = ReportFn()
    if mllp is not None:
        try:
            host, port = parse_address(mllp, default_host="127.0.0.1")
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--mllp") from None
        answers = asyncio.run(send_mllp(messages, host, port, tls_config, timeout, report))
    else:
        assert url is not None
        answers = asyncio.run(send_http(messages, url, token, tls_config, timeout, report))
    summary = ", ".join(f"{code} {n}" for code, n in sorted(report.counts.items()))
    accepted = sum(a.accepted for a in answers)
    written = sum(a.written for a in answers)
    unsent = len(messages) - written  # never went out: after a failure, or refused unsent
    tail = f"; {unsent} not sent" if unsent else ""
    click.echo(f"sent {written} of {len(messages)}: {summary}{tail}", err=True)
    if accepted != len(messages):
        sys.exit(1)
