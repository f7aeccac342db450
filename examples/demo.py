"""``make demo``: inturn doing its job on one machine, in well under two minutes.

What happens, in order (each step prints a line as it happens):

1. An embedded Postgres starts in a fresh temporary directory, then ``inturn local`` starts
   with the two example Destinations of channel ``adt`` (``local-mllp.yaml``: MLLP to
   127.0.0.1:2576; ``local-http.yaml``: HTTP POST to http://127.0.0.1:8090/hl7) and an MLLP
   listener for the channel on port 2575.
2. This script starts the two receivers those Destinations point at.
3. It sends a few hundred made-up HL7 v2.5 messages (``demo_messages.py``: admissions, lab
   results, discharges) to port 2575 with ``inturn send``, in batches (a folder of message
   files each, one ``inturn send`` per batch, sent one at a time over one MLLP connection), and
   counts the AA acknowledgements from its output. inturn answers AA only once a message is
   stored.
4. A third of the way through, the MLLP receiver goes down for a while. Sending goes on; the
   HTTP receiver keeps getting messages; ``inturn queue depth`` shows the MLLP queue growing.
   Then the receiver comes back and inturn catches up on its retry schedule. Every duration
   it prints (how long the receiver was down, when each depth was read, how long the catching
   up took) is measured, not planned.
5. When nothing is pending, it prints a summary and checks, at each receiver, that every
   acknowledged message arrived, unchanged, in the order sent (so no discharge came before
   its admission). A message delivered twice is counted: at most one, the one in flight when
   the MLLP receiver went down, is expected.
6. Everything is stopped (``inturn local`` with Ctrl-C, as a user would). Exit status 0 means
   every check passed; otherwise the failing checks are printed and the status is 1 (2 when
   the demo could not start, e.g. a port is taken).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from demo_messages import Message, generate  # examples/, next to this file
from psycopg import AsyncConnection

from inturn.worker.hl7.header import parse_header
from inturn.worker.local.embedded import start_embedded
from inturn.worker.store import reads
from inturn.worker.testing import HttpReceiver, MllpReceiver

HERE = Path(__file__).resolve().parent
INTURN = Path(sys.executable).with_name("inturn")
MANIFESTS = [HERE / "local-mllp.yaml", HERE / "local-http.yaml"]
INGEST_PORT, MLLP_PORT, HTTP_PORT = 2575, 2576, 8090  # as in the two manifests

BATCHES = 7  # `inturn send` runs, one file of messages each
BATCH_INTERVAL = 1.5  # seconds between the start of two batches
OUTAGE_SECONDS = 10.0  # how long the MLLP receiver stays down
DEPTH_AT = (3.0, 8.0)  # seconds into the outage at which the queue depth is read
DRAIN_DEADLINE = 60.0  # seconds allowed after the last message to deliver everything

STARTED = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - STARTED:5.1f}s] {text}", flush=True)


class CannotStart(Exception):
    """The demo could not set itself up (exit status 2)."""


def check_ports_free(ports: list[int]) -> None:
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                raise CannotStart(
                    f"port {port} is already in use; the demo needs ports "
                    f"{', '.join(map(str, ports))} "
                    "(is another demo or `inturn local` running?)"
                ) from None


async def start_inturn_local(dsn: str) -> tuple[asyncio.subprocess.Process, asyncio.Task[None]]:
    """Start `inturn local` and wait until its MLLP listener accepts; its log is echoed."""
    args = ["local", *(a for m in MANIFESTS for a in ("-f", str(m.relative_to(HERE.parent))))]
    args += ["--listen", f"adt=127.0.0.1:{INGEST_PORT}", "--dsn", dsn]
    say("$ inturn " + " ".join(args[:-1]) + " <the embedded Postgres>")
    proc = await asyncio.create_subprocess_exec(
        str(INTURN), *args, cwd=HERE.parent, stderr=asyncio.subprocess.PIPE
    )
    echo = asyncio.create_task(echo_log(proc))
    deadline = time.monotonic() + 30
    while True:  # until its MLLP listener accepts a connection
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", INGEST_PORT)
            writer.close()
            return proc, echo
        if proc.returncode is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            await echo
            raise CannotStart(f"inturn local did not start listening on {INGEST_PORT}")
        await asyncio.sleep(0.2)


async def echo_log(proc: asyncio.subprocess.Process) -> None:
    """Print inturn local's log lines as they come, with our clock instead of its own."""
    assert proc.stderr is not None
    async for raw in proc.stderr:
        line = re.sub(r"^\d\d:\d\d:\d\d\S*\s+", "", raw.decode(errors="replace").rstrip())
        say("  inturn local | " + re.sub(r"^(\w+)\s+", r"\1 ", line))


async def queue_depth(dsn: str) -> str:
    """What `inturn queue depth` prints."""
    proc = await asyncio.create_subprocess_exec(
        str(INTURN), "queue", "depth", "--dsn", dsn, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return out.decode().rstrip()


async def pending(dsn: str) -> int:
    async with await AsyncConnection.connect(dsn) as conn:
        return sum(row.pending for row in await reads.depth(conn))


@dataclass
class Outage:
    """What was measured around the MLLP receiver's outage (seconds, by the monotonic clock)."""

    depths: list[tuple[float, str]]  # (when it was read, into the outage; `inturn queue depth`)
    down_for: float = 0.0  # from stopping the receiver to starting it again
    caught_up_after: float | None = None  # from the receiver's return to an empty MLLP queue


async def mllp_pending(dsn: str) -> int:
    async with await AsyncConnection.connect(dsn) as conn:
        return sum(r.pending for r in await reads.depth(conn) if r.destination.endswith("mllp"))


async def outage(receiver: MllpReceiver, dsn: str, begin: asyncio.Event, seen: Outage) -> None:
    """When ``begin`` is set, take the MLLP receiver down, read the queue depth while it is
    down, bring it back, and measure how long the MLLP queue takes to empty."""
    await begin.wait()
    await receiver.stop()
    say(f"MLLP receiver DOWN for {OUTAGE_SECONDS:.0f} s (sending goes on)")
    down = time.monotonic()
    for at in DEPTH_AT:
        await asyncio.sleep(at - (time.monotonic() - down))
        measured = time.monotonic() - down
        table = await queue_depth(dsn)
        seen.depths.append((measured, table))
        say(f"$ inturn queue depth   ({measured:.1f} s after the MLLP receiver went down)")
        print("\n".join("         " + line for line in table.splitlines()), flush=True)
    await asyncio.sleep(OUTAGE_SECONDS - (time.monotonic() - down))
    await receiver.start()
    up = time.monotonic()
    seen.down_for = up - down
    say(
        f"MLLP receiver UP again after {seen.down_for:.1f} s; inturn resumes on its next retry"
        " (backoff 5 s, doubling)"
    )
    deadline = up + DRAIN_DEADLINE
    while time.monotonic() < deadline:
        if not await mllp_pending(dsn):
            seen.caught_up_after = time.monotonic() - up
            say(f"MLLP queue empty {seen.caught_up_after:.1f} s after the receiver came back")
            return
        await asyncio.sleep(0.2)


async def send_batch(folder: Path, number: int, batch: list[Message]) -> list[str]:
    """Write ``batch`` to a folder, one file per message, and send it with `inturn send`;
    return the control IDs it reports answered AA."""
    path = folder / f"batch-{number:02d}"
    path.mkdir()
    for i, message in enumerate(batch):
        (path / f"{i:04d}.hl7").write_bytes(message.payload)
    args = ["send", "--mllp", f"127.0.0.1:{INGEST_PORT}", "--timeout", "10", str(path)]
    proc = await asyncio.create_subprocess_exec(
        str(INTURN), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    lines = out.decode().splitlines()
    say(f"$ inturn send --mllp 127.0.0.1:{INGEST_PORT} {path.name}/   -> {err.decode().strip()}")
    for line in lines:
        if not line.startswith("AA "):
            say(f"  not accepted: {line}")
    return [line.split()[1] for line in lines if line.startswith("AA ")]


async def send_all(
    messages: list[Message], mllp: MllpReceiver, http: HttpReceiver, outage_begins: asyncio.Event
) -> list[Message]:
    """Send every message in :data:`BATCHES` runs of `inturn send`, in order; return those
    answered AA. After a third of the batches, set ``outage_begins``."""
    by_id = {m.control_id: m for m in messages}
    size = -(-len(messages) // BATCHES)
    acked: list[Message] = []
    with tempfile.TemporaryDirectory(prefix="inturn-demo-feed-") as folder:
        for n in range(BATCHES):
            tick = time.monotonic()
            batch = messages[n * size : (n + 1) * size]
            acked += [by_id[c] for c in await send_batch(Path(folder), n + 1, batch) if c in by_id]
            if n + 1 == BATCHES // 3:
                outage_begins.set()
            say(
                f"sent {min((n + 1) * size, len(messages))}/{len(messages)}, {len(acked)} AA"
                f" | received so far: MLLP {len(mllp.received)}, HTTP {len(http.received)}"
            )
            await asyncio.sleep(BATCH_INTERVAL - (time.monotonic() - tick))
    return acked


@dataclass
class Feed:
    sent: int
    acked: list[Message]
    outage: Outage
    left: int  # still pending at the end
    took: float


async def feed(dsn: str, mllp: MllpReceiver, http: HttpReceiver) -> Feed:
    """Send the messages with the outage on the way, then wait until nothing is pending."""
    messages = generate()
    say(f"sending {len(messages)} messages (ADT^A01, ORU^R01, ADT^A03) to port {INGEST_PORT}")
    seen = Outage(depths=[])
    begin = asyncio.Event()
    acked, _ = await asyncio.gather(
        send_all(messages, mllp, http, begin), outage(mllp, dsn, begin, seen)
    )
    say("waiting until nothing is pending")
    deadline = time.monotonic() + DRAIN_DEADLINE
    shown = -1
    while (left := await pending(dsn)) and time.monotonic() < deadline:
        if left != shown:
            say(f"pending: {left}")
            shown = left
        await asyncio.sleep(1.0)
    if not left:
        say("everything delivered")
    return Feed(len(messages), acked, seen, left, time.monotonic() - STARTED)


@dataclass
class Tally:
    """What one receiver got, measured against the messages acknowledged AA."""

    distinct: int = 0
    duplicates: int = 0
    out_of_order: int = 0  # arrived after a message sent later than it
    missing: int = 0
    changed: int = 0  # bytes differ from those sent
    unexpected: int = 0  # not a message this demo had acknowledged
    discharge_first: int = 0  # an A03 delivered before the same patient's A01


def tally(received: list[bytes], acked: list[Message]) -> Tally:
    position = {m.control_id: i for i, m in enumerate(acked)}
    t = Tally()
    seen: set[str] = set()
    admitted: set[str] = set()
    latest = -1
    for payload in received:
        i = position.get(parse_header(payload).control_id)
        if i is None:
            t.unexpected += 1
            continue
        message = acked[i]
        t.changed += payload != message.payload
        if message.control_id in seen:
            t.duplicates += 1
            continue
        seen.add(message.control_id)
        t.out_of_order += i < latest
        latest = max(latest, i)
        if message.kind == "A01":
            admitted.add(message.patient)
        t.discharge_first += message.kind == "A03" and message.patient not in admitted
    t.distinct = len(seen)
    t.missing = len(acked) - len(seen)
    return t


def problems(name: str, t: Tally, duplicates_allowed: int) -> list[str]:
    found = [
        f"{name}: {value} {what}"
        for value, what in (
            (t.missing, "acknowledged message(s) never arrived"),
            (t.out_of_order, "message(s) arrived out of order"),
            (t.discharge_first, "discharge(s) arrived before the admission"),
            (t.changed, "message(s) arrived changed"),
            (t.unexpected, "message(s) arrived that were never acknowledged"),
        )
        if value
    ]
    if t.duplicates > duplicates_allowed:
        found.append(f"{name}: {t.duplicates} duplicates (at most {duplicates_allowed} expected)")
    return found


async def scenario(dsn: str) -> list[str]:
    """Run the demo against the database at ``dsn``; return what went wrong (nothing: OK)."""
    mllp, http = MllpReceiver(port=MLLP_PORT), HttpReceiver(port=HTTP_PORT)
    inturn, echo = await start_inturn_local(dsn)
    try:
        await mllp.start()
        await http.start()
        say(f"receivers up: MLLP on {MLLP_PORT}, HTTP on {HTTP_PORT}")
        # Run the feed until it ends, inturn local exits, or the user presses Ctrl-C.
        interrupted = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupted.set)
        work = asyncio.create_task(feed(dsn, mllp, http))
        others = {asyncio.create_task(inturn.wait()), asyncio.create_task(interrupted.wait())}
        await asyncio.wait({work, *others}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            work.cancel()
            await asyncio.wait({work})
            if interrupted.is_set():
                return ["interrupted (Ctrl-C)"]
            return [f"inturn local exited unexpectedly (status {inturn.returncode})"]
        result = work.result()
    finally:
        if inturn.returncode is None:
            say("stopping inturn local (Ctrl-C)")
            inturn.send_signal(signal.SIGINT)
        try:
            code = await asyncio.wait_for(inturn.wait(), 30)
        except TimeoutError:
            inturn.kill()
            code = await inturn.wait()
        await echo
        say(f"inturn local exited with status {code}")
        await mllp.stop()
        await http.stop()

    rx_mllp, rx_http = tally(mllp.received, result.acked), tally(http.received, result.acked)
    print_summary(result, rx_mllp, rx_http)
    failures = problems("MLLP receiver", rx_mllp, 1) + problems("HTTP receiver", rx_http, 0)
    if len(result.acked) < result.sent:
        failures.append(f"{result.sent - len(result.acked)} message(s) not acknowledged AA")
    if result.left:
        failures.append(f"{result.left} still pending after {DRAIN_DEADLINE:.0f} s")
    if code != 0:
        failures.append(f"inturn local exited with status {code} on Ctrl-C")
    return failures


def print_summary(result: Feed, mllp: Tally, http: Tally) -> None:
    rows = [
        ("delivered", "distinct"),
        ("duplicates", "duplicates"),
        ("out of order", "out_of_order"),
        ("discharge before admission", "discharge_first"),
        ("missing", "missing"),
    ]
    print("\nSummary")
    print(f"  {'sent':28}{result.sent}")
    print(f"  {'acknowledged AA':28}{len(result.acked)}")
    print(f"  {'':28}{'MLLP receiver':16}HTTP receiver")
    for label, field in rows:
        print(f"  {label:28}{getattr(mllp, field):<16}{getattr(http, field)}")
    print(f"  {'still pending':28}{result.left}")
    print(f"  {'time taken':28}{result.took:.1f} s")
    seen = result.outage
    print(f"  {'MLLP receiver down for':28}{seen.down_for:.1f} s")
    caught_up = "not within the deadline"
    if seen.caught_up_after is not None:
        caught_up = f"{seen.caught_up_after:.1f} s after it came back"
    print(f"  {'MLLP queue empty':28}{caught_up}")
    for at, table in seen.depths:
        print(f"  queue depth, read {at:.1f} s after the MLLP receiver went down:")
        print("\n".join("    " + line for line in table.splitlines()))
    if mllp.duplicates:
        print(
            "  (a duplicate at the MLLP receiver is the message in flight when it went down:"
            " inturn sent it again because no ACK came back; at most one per outage)"
        )


def main() -> int:
    data_dir = Path(tempfile.mkdtemp(prefix="inturn-demo-"))
    try:
        check_ports_free([INGEST_PORT, MLLP_PORT, HTTP_PORT])
        say(f"starting an embedded Postgres in {data_dir}")
        pg = start_embedded(data_dir)
    except (CannotStart, RuntimeError) as exc:
        print(f"demo cannot start: {exc}", file=sys.stderr)
        shutil.rmtree(data_dir, ignore_errors=True)
        return 2
    failures = ["interrupted"]
    try:
        failures = asyncio.run(scenario(pg.dsn))
    except CannotStart as exc:
        failures = [str(exc)]
    except KeyboardInterrupt:
        pass
    finally:
        pg.stop()
        say("embedded Postgres stopped")
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        print(f"(the database is kept in {data_dir})", file=sys.stderr)
        return 1
    shutil.rmtree(data_dir, ignore_errors=True)
    print("\nOK: every acknowledged message reached both receivers, unchanged and in order.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
