"""A receiver being down never spends a message's attempts (issue 18, item 7).

A destination that cannot be reached (refused, reset before any reply, a TLS handshake that
never finishes) holds its queue: nothing is marked failed however long it lasts, and when the
receiver comes up every message arrives, in order. Only an answer about the message (here: no
ACK in time after it was written) counts towards ``maxAttempts``; ``retry.unreachable: count``
brings back the old behaviour.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import LiteralString

import pytest
from psycopg import AsyncConnection

from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.senders.base import DeliveryError
from inturn.worker.senders.http import HttpSender, HttpSenderConfig
from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
from inturn.worker.senders.tls import TlsConfig
from inturn.worker.spec.config import RetryPolicy, WorkerConfig
from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from inturn.worker.testing import HttpReceiver, MllpReceiver
from inturn.worker.worklist.delivery_rules import destination_stuck
from tests.support.pipeline import register, until
from tests.support.pipeline import worker as running
from tests.support.ports import free_port

DEST = "ward/down"
MESSAGES = 5
#: maxAttempts 3 with a one-second backoff: the policy that failed five messages in half a minute.
THREE = RetryPolicy(max_attempts=3, backoff_seconds=1, max_backoff_seconds=1, timeout_seconds=5)


def message(n: int) -> bytes:
    return (
        f"MSH|^~\\&|ADT|HOSP|LAB|HOSP|20261201120000||ADT^A01|DOWN{n:03d}|P|2.5\r"
        f"PID|1||P{n}^^^HOSP^MR||DOE^JANE\r"
    ).encode()


def worker(
    dsn: str, port: int, retry: RetryPolicy
) -> AbstractAsyncContextManager[DestinationWorker]:
    sender = MllpSenderConfig("127.0.0.1", port)
    cfg = WorkerConfig(destination=DEST, channel="adt", sender=sender, retry=retry, idle_seconds=1)
    return running(cfg, dsn)


async def enqueue(dsn: str) -> None:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        await queue.enqueue(
            conn,
            [
                NewItem(DEST, "adt", f"DOWN{n:03d}", "ADT^A01", message(n))
                for n in range(1, MESSAGES + 1)
            ],
        )


async def fetch(dsn: str, sql: LiteralString) -> list[tuple[object, ...]]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(sql)
        return list(await cur.fetchall())


async def count(dsn: str, sql: LiteralString) -> int:
    rows = await fetch(dsn, sql)
    return int(str(rows[0][0]))


async def head_tried(dsn: str, times: int) -> bool:
    """Whether the head has failed at least ``times`` times (each try leaves a history row)."""
    tries = await count(
        dsn,
        "SELECT count(*) FROM inturn_attempt WHERE item_id = (SELECT min(id) FROM inturn_delivery)",
    )
    return tries >= times


async def stuck(dsn: str) -> list[str]:
    """Run the sweeper's destination-stuck rule; the destinations on ``delivery-stuck``."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        await destination_stuck(conn, limit=10, dry_run=False)
        cur = await conn.execute(
            "SELECT record_key FROM inturn_worklist_item"
            " WHERE queue = 'delivery-stuck' AND state = 'pending'"
        )
        return [str(r[0]) for r in await cur.fetchall()]


async def test_a_refused_port_holds_the_queue_and_spends_no_attempt(fresh_db: str) -> None:
    receiver = MllpReceiver()
    await receiver.start()
    port = receiver.port
    await receiver.stop()  # the port is refused from now on, until the receiver comes up
    register(fresh_db, DEST, "adt", stuck_after_seconds=1)
    await enqueue(fresh_db)
    async with worker(fresh_db, port, THREE):
        # three times maxAttempts: with the old rule every message would have failed by now
        await until(lambda: head_tried(fresh_db, 3 * THREE.max_attempts), timeout=60)
        rows = await fetch(fresh_db, "SELECT state, attempts, last_error FROM inturn_delivery")
        assert len(rows) == MESSAGES
        assert {(r[0], r[1]) for r in rows} == {("pending", 0)}
        [(head_error,)] = await fetch(
            fresh_db, "SELECT last_error FROM inturn_delivery ORDER BY id LIMIT 1"
        )
        assert str(head_error).startswith("unreachable: connect 127.0.0.1:")
        failed = await fetch(
            fresh_db, "SELECT count(*) FROM inturn_worklist_item WHERE queue = 'delivery-failed'"
        )
        assert failed == [(0,)]
        # what a person sees instead: the destination raised as stuck
        assert await stuck(fresh_db) == [DEST]
        await receiver.start()  # the receiver comes up on the same port
        assert receiver.port == port
        try:
            await receiver.wait_for(MESSAGES, timeout=30)
        finally:
            await receiver.stop()
        await until(lambda: _all_delivered(fresh_db), timeout=60)
    ids = [p.split(b"|")[9].decode() for p in receiver.received]
    assert ids == [f"DOWN{n:03d}" for n in range(1, MESSAGES + 1)]
    rows = await fetch(fresh_db, "SELECT state, attempts FROM inturn_delivery ORDER BY id")
    assert rows == [("delivered", 1)] * MESSAGES
    assert await stuck(fresh_db) == []  # cleared once nothing waits


async def test_unreachable_count_keeps_the_old_behaviour(fresh_db: str) -> None:
    receiver = MllpReceiver()
    await receiver.start()
    port = receiver.port
    await receiver.stop()
    await enqueue(fresh_db)
    counted = RetryPolicy(
        max_attempts=2, backoff_seconds=1, max_backoff_seconds=1, unreachable="count"
    )
    async with worker(fresh_db, port, counted):
        await until(lambda: _failed_count(fresh_db, 2), timeout=60)
    rows = await fetch(fresh_db, "SELECT state, attempts FROM inturn_delivery ORDER BY id LIMIT 2")
    assert rows == [("failed", 2), ("failed", 2)]


async def test_an_unanswered_message_still_counts(fresh_db: str) -> None:
    """Written and never answered: an answer about this message (none in time), counted."""
    receiver = MllpReceiver()
    receiver.reply = False
    quick = RetryPolicy(max_attempts=2, backoff_seconds=1, max_backoff_seconds=1, timeout_seconds=1)
    await enqueue(fresh_db)
    async with receiver, worker(fresh_db, receiver.port, quick):
        await until(lambda: _failed_count(fresh_db, 1), timeout=60)
    [(state, attempts, error)] = await fetch(
        fresh_db, "SELECT state, attempts, last_error FROM inturn_delivery ORDER BY id LIMIT 1"
    )
    assert (state, attempts) == ("failed", 2)
    assert str(error).startswith("timeout: ")


async def test_a_tls_handshake_that_never_finishes_is_unreachable() -> None:
    """The receiver accepts TCP and never answers the handshake: nothing of the message was
    written when the attempt's time ran out."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sender = MllpSender(
        MllpSenderConfig("127.0.0.1", port, tls=TlsConfig(insecure_skip_verify=True)),
        timeout_seconds=1,
    )
    try:
        with pytest.raises(DeliveryError) as info:
            await sender.send(message(1))
    finally:
        await sender.close()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
    assert info.value.outcome == "unreachable" and not sender.written
    assert accepted  # the TCP connection was made; the handshake was what never finished


async def _all_delivered(dsn: str) -> bool:
    delivered = await count(dsn, "SELECT count(*) FROM inturn_delivery WHERE state = 'delivered'")
    return delivered == MESSAGES


async def _failed_count(dsn: str, n: int) -> bool:
    return await count(dsn, "SELECT count(*) FROM inturn_delivery WHERE state = 'failed'") >= n


async def test_http_refused_is_unreachable_and_unanswered_is_a_timeout() -> None:
    """The HTTP sender says the same: refused before anything was written is unreachable; a
    request written and never answered is a timeout (an answer about the message: none)."""
    held: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # reads nothing, answers nothing

    nobody = free_port()  # nothing listens there
    refused = HttpSender(HttpSenderConfig(f"http://127.0.0.1:{nobody}/hl7"), timeout_seconds=2)
    try:
        with pytest.raises(DeliveryError) as info:
            await refused.send(message(1))
        assert info.value.outcome == "unreachable" and not refused.written
    finally:
        await refused.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    quiet = HttpSender(HttpSenderConfig(f"http://127.0.0.1:{port}/hl7"), timeout_seconds=1)
    try:
        with pytest.raises(DeliveryError) as info:
            await quiet.send(message(1))
        assert info.value.outcome == "timeout" and quiet.written
    finally:
        await quiet.close()
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


#: A backoff that would make a returning receiver wait a minute (the reported 51 s).
LONG = RetryPolicy(max_attempts=0, backoff_seconds=60, max_backoff_seconds=60, timeout_seconds=5)


@pytest.mark.serial  # timing: within a probe interval, not a backoff of 60 s
async def test_a_receiver_that_comes_back_is_found_within_a_probe_interval(fresh_db: str) -> None:
    """Down long enough for the backoff to reach a minute, the receiver comes back: the worker
    probes it every few seconds while it waits (a connect, no message) and sends at once,
    instead of at the end of the backoff (issue 39, part 3). The attempts are still not spent;
    nothing is sent by a probe."""
    from inturn.worker.drain.stream import PROBE_SECONDS

    receiver = MllpReceiver()
    await receiver.start()
    port = receiver.port
    await receiver.stop()
    await enqueue(fresh_db)
    cfg = WorkerConfig(
        destination=DEST,
        channel="adt",
        sender=MllpSenderConfig("127.0.0.1", port),
        retry=LONG,
        idle_seconds=120,  # the wait is the backoff's, not an idle poll's
    )
    async with running(cfg, fresh_db):
        await until(lambda: head_tried(fresh_db, 1), timeout=30)
        [(wait,)] = await fetch(
            fresh_db,
            "SELECT extract(epoch FROM next_attempt - clock_timestamp())::float8"
            " FROM inturn_delivery ORDER BY id LIMIT 1",
        )
        assert float(str(wait)) > 30  # held for the long backoff
        loop = asyncio.get_running_loop()
        await receiver.start()
        back = loop.time()
        try:
            await receiver.wait_for(1, timeout=30)
            took = loop.time() - back
            await receiver.wait_for(MESSAGES, timeout=30)
        finally:
            await receiver.stop()
    # within a probe interval and a probe, on a shared machine's margin: far under the minute
    assert took < PROBE_SECONDS + 5
    ids = [p.split(b"|")[9].decode() for p in receiver.received]
    assert ids == [f"DOWN{n:03d}" for n in range(1, MESSAGES + 1)]
    rows = await fetch(fresh_db, "SELECT state, attempts FROM inturn_delivery ORDER BY id")
    assert rows == [("delivered", 1)] * MESSAGES


async def _comes_back(
    dsn: str, receiver: MllpReceiver | HttpReceiver, sender: object, lanes: int = 1
) -> tuple[float, list[bytes]]:
    """Hold the queue for a stopped receiver until its backoff reaches a minute, start it
    again on its port; the seconds from its start to the first message, and what it got."""
    await enqueue(dsn)
    cfg = WorkerConfig(
        destination=DEST,
        channel="adt",
        sender=sender,  # type: ignore[arg-type]
        retry=LONG,
        idle_seconds=120,
        lanes=lanes,
    )
    async with running(cfg, dsn):
        await until(lambda: head_tried(dsn, 1), timeout=30)
        loop = asyncio.get_running_loop()
        await receiver.start()
        back = loop.time()
        try:
            while not receiver.received:
                await asyncio.sleep(0.05)
                assert loop.time() - back < 30
            took = loop.time() - back
            while len(receiver.received) < MESSAGES:
                await asyncio.sleep(0.05)
                assert loop.time() - back < 60
        finally:
            await receiver.stop()
    return took, list(receiver.received)


@pytest.mark.serial  # timing: within a probe interval, not a backoff of 60 s
async def test_lanes_find_a_receiver_that_comes_back_within_a_probe_interval(
    fresh_db: str,
) -> None:
    """The lanes probe an unreachable receiver too, and every row it held goes at once."""
    from inturn.worker.drain.stream import PROBE_SECONDS

    receiver = MllpReceiver()
    await receiver.start()
    port = receiver.port
    await receiver.stop()
    took, received = await _comes_back(
        fresh_db, receiver, MllpSenderConfig("127.0.0.1", port), lanes=4
    )
    assert took < PROBE_SECONDS + 5
    assert sorted(p.split(b"|")[9].decode() for p in received) == [
        f"DOWN{n:03d}" for n in range(1, MESSAGES + 1)
    ]
    rows = await fetch(fresh_db, "SELECT state, attempts FROM inturn_delivery ORDER BY id")
    assert rows == [("delivered", 1)] * MESSAGES


@pytest.mark.serial  # timing: within a probe interval, not a backoff of 60 s
async def test_an_http_receiver_that_comes_back_is_found_within_a_probe_interval(
    fresh_db: str,
) -> None:
    from inturn.worker.drain.stream import PROBE_SECONDS

    receiver = HttpReceiver()
    await receiver.start()
    port = receiver.port
    await receiver.stop()
    receiver = HttpReceiver(port=port)
    took, received = await _comes_back(
        fresh_db, receiver, HttpSenderConfig(f"http://127.0.0.1:{port}/hl7")
    )
    assert took < PROBE_SECONDS + 5
    assert [p.split(b"|")[9].decode() for p in received] == [
        f"DOWN{n:03d}" for n in range(1, MESSAGES + 1)
    ]


async def test_probes_connect_and_send_nothing(tmp_path: Path) -> None:
    """An HTTP probe is a connect (and TLS for https), never a request; an SFTP probe reads the
    server's SSH identification line and logs in to nothing; a closed port or a server that is
    not SSH is not reachable."""
    from inturn.worker.senders.sftp import SftpSender, SftpSenderConfig
    from tests.support.sftp_server import SftpServer

    async with HttpReceiver() as http:
        sender = HttpSender(HttpSenderConfig(f"http://127.0.0.1:{http.port}/hl7"))
        assert await sender.probe() is True
        assert http.received == []
    assert await sender.probe() is False  # stopped: refused
    async with SftpServer(tmp_path) as server:
        config = SftpSenderConfig(
            host="127.0.0.1",
            port=server.port,
            username="partner",
            directory="inbox",
            private_key_file=str(server.secret_dir / "id_ed25519"),
            known_hosts_file=str(server.secret_dir / "known_hosts"),
        )
        sftp = SftpSender(config)
        assert await sftp.probe() is True
        assert sftp.connections_opened == 0 and server.files() == []
    assert await SftpSender(config).probe() is False
    not_ssh = await asyncio.start_server(_say_http, "127.0.0.1", 0)
    port = not_ssh.sockets[0].getsockname()[1]
    try:
        other = SftpSenderConfig(
            host="127.0.0.1",
            port=port,
            username="partner",
            directory="inbox",
            private_key_file=config.private_key_file,
            known_hosts_file=config.known_hosts_file,
        )
        assert await SftpSender(other).probe() is False
    finally:
        not_ssh.close()
        await not_ssh.wait_closed()


async def _say_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    await writer.drain()
    writer.close()
