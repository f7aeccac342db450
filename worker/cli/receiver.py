"""``inturn receiver``: a receiving peer to point destinations at while trying inturn.

It listens for MLLP (and, with ``--http``, HTTP POSTs), prints one line per message (the
channel it came on, MSH-10 control ID, MSH-9 type, size; never the content) and answers it: an
ACK with MSA-1 ``--ack`` (AA by default; AE or AR to see how a destination's ``ackPolicy``
treats a refusal, per HL7 v2.5 chapter 2 "acknowledgment messages"), or nothing with
``--silent`` (the sender times out, over MLLP and HTTP alike). HTTP answers ``--http-status``.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import click

from inturn.worker.hl7.errors import HeaderError
from inturn.worker.hl7.header import parse_header
from inturn.worker.testing import HttpReceiver, MllpReceiver
from inturn.worker.text.addresses import parse_address


def describe(payload: bytes) -> str:
    """``<control id>  <type>  <n> bytes`` of a message, or what is wrong with its MSH."""
    try:
        header = parse_header(payload)
    except HeaderError as exc:
        return f"(unreadable MSH: {exc.text})  {len(payload)} bytes"
    return f"{header.control_id}  {header.message_type.type_key}  {len(payload)} bytes"


def _ack_code(ack: bytes | None) -> str:
    if ack is None:
        return "no answer"
    for segment in ack.split(b"\r"):
        if segment.startswith(b"MSA"):
            fields = segment.split(segment[3:4]) if len(segment) > 3 else []
            return fields[1].decode("latin-1") if len(fields) > 1 else "ACK"
    return "ACK"


def _address(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[str, int] | None:
    if value is None:
        return None
    try:
        return parse_address(value, default_host="127.0.0.1")
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("receiver")
@click.option(
    "--mllp",
    metavar="[HOST:]PORT",
    required=True,
    callback=_address,
    help="Listen for MLLP here (host 127.0.0.1 unless given; 0.0.0.0 for every interface).",
)
@click.option("--http", metavar="[HOST:]PORT", callback=_address, help="Also take HTTP POSTs here.")
@click.option(
    "--ack",
    "ack_code",
    type=click.Choice(["AA", "AE", "AR", "CA", "CE", "CR"]),
    default="AA",
    show_default=True,
    help="MSA-1 of every ACK.",
)
@click.option("--ack-text", default=None, help="MSA-3 text of every ACK.")
@click.option("--silent", is_flag=True, help="Read messages and never answer (senders time out).")
@click.option(
    "--http-status",
    type=click.IntRange(100, 599),
    default=200,
    show_default=True,
    help="HTTP status of every answer.",
)
def receiver_command(
    mllp: tuple[str, int],
    http: tuple[str, int] | None,
    ack_code: str,
    ack_text: str | None,
    silent: bool,
    http_status: int,
) -> None:
    """Receive HL7 v2 like a downstream system: one line per message, then ACK it."""
    asyncio.run(_serve(mllp, http, ack_code, ack_text, silent, http_status))


async def _serve(
    mllp: tuple[str, int],
    http: tuple[str, int] | None,
    ack_code: str,
    ack_text: str | None,
    silent: bool,
    http_status: int,
) -> None:
    counts = {"mllp": 0, "http": 0}

    def on_mllp(payload: bytes, ack: bytes | None) -> None:
        counts["mllp"] += 1
        click.echo(f"mllp  {describe(payload)}  -> {_ack_code(ack)}")

    def on_http(body: bytes, status: int) -> None:
        counts["http"] += 1
        click.echo(f"http  {describe(body)}  -> {'no answer' if silent else status}")

    receivers: list[Any] = []
    mllp_receiver = MllpReceiver(mllp[0], mllp[1], ack_code)
    mllp_receiver.ack_text = ack_text
    mllp_receiver.reply = not silent
    mllp_receiver.on_message = on_mllp
    await mllp_receiver.start()
    receivers.append(mllp_receiver)
    answer = "never answering" if silent else f"answering {ack_code}"
    click.echo(f"receiving MLLP on {mllp[0]}:{mllp_receiver.port} ({answer})")
    if http is not None:
        http_receiver = HttpReceiver(http[0], http[1], http_status)
        http_receiver.on_message = on_http
        http_receiver.silent = silent
        try:
            await http_receiver.start()
        except BaseException:
            await mllp_receiver.stop()
            raise
        receivers.append(http_receiver)
        answer = "never answering" if silent else f"answering {http_status}"
        click.echo(f"receiving HTTP on {http[0]}:{http_receiver.port} ({answer})")
    click.echo("Ctrl-C to stop")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for receiver in receivers:
            await receiver.stop()
    total = ", ".join(f"{n} over {kind.upper()}" for kind, n in counts.items() if n) or "none"
    click.echo(f"stopped; messages received: {total}")
