"""Lanes (spec.lanes.count above 1) end to end: a real Postgres, real MLLP receivers over real
sockets, and the worker's lane path (inturn.worker.drain.lane_runner).

Every test checks the receiver's arrival order against the enqueue order: for each patient, its
messages arrive in enqueue order, and a merge (A40) arrives after every earlier message of both
patients it names and before every later one; a message without a patient identifier arrives
after everything enqueued before it and before everything after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import REGISTRY
from psycopg import AsyncConnection

from inturn.worker.drain.health import make_app
from inturn.worker.drain.lanes import Hold, conflict, summarize
from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.hl7.pid import index_keys
from inturn.worker.senders.http import HttpSenderConfig
from inturn.worker.senders.mllp import MllpSender
from inturn.worker.spec.config import WorkerConfig
from inturn.worker.store import actions, queue, reads, registry
from inturn.worker.store.model import NewItem
from inturn.worker.testing import HttpReceiver, MllpReceiver
from tests.support.db import register
from tests.support.pipeline import QUICK_LEASE, worker_config
from tests.support.pipeline import worker as running

DEST = "ward/lanes"
INTURN = str(Path(sys.executable).with_name("inturn"))


@dataclass(frozen=True)
class Sent:
    """One enqueued message: its MSH-10 and its payload."""

    control_id: str
    payload: bytes


def adt(n: int, patient: int, event: str = "A08") -> Sent:
    cid = f"M{n:06d}"
    return Sent(
        cid,
        (
            f"MSH|^~\\&|ADT|HOSP|EHR|HOSP|20261201080000||ADT^{event}|{cid}|P|2.5\r"
            f"PID|1||P{patient}^^^HOSP^MR||DOE^JANE\r"
        ).encode(),
    )


def merge(n: int, survivor: int, retired: int) -> Sent:
    cid = f"M{n:06d}"
    return Sent(
        cid,
        (
            f"MSH|^~\\&|ADT|HOSP|EHR|HOSP|20261201080000||ADT^A40|{cid}|P|2.5\r"
            f"PID|1||P{survivor}^^^HOSP^MR||DOE^JANE\r"
            f"MRG|P{retired}^^^HOSP^MR\r"
        ).encode(),
    )


def master_file(n: int) -> Sent:
    cid = f"M{n:06d}"
    return Sent(
        cid,
        (
            f"MSH|^~\\&|ADT|HOSP|EHR|HOSP|20261201080000||MFN^M02|{cid}|P|2.5\rMFI|PRA||UPD|||NE\r"
        ).encode(),
    )


def feed(count: int, patients: int, merge_every: int = 0) -> list[Sent]:
    """``count`` messages over ``patients`` patients, a merge every ``merge_every`` messages."""
    out = []
    for n in range(count):
        if merge_every and n % merge_every == merge_every - 1:
            # the retired patient had the message just before: the merge must wait for it
            out.append(merge(n, n % patients, (n - 1) % patients))
        else:
            out.append(adt(n, n % patients))
    return out


class Receiver(MllpReceiver):
    """An MLLP receiver that processes its connections independently, as a receiver that may
    take lanes does: each message takes ``base`` seconds plus a random part up to ``jitter``,
    and is applied (recorded in :attr:`applied`) when it is answered AA, so two messages in
    flight at once are applied in either order. It counts the connections open at once and
    can fail the messages of chosen patients (AE) for a while."""

    def __init__(self, base: float = 0.0, jitter: float = 0.0) -> None:
        super().__init__()
        self.base, self.jitter = base, jitter
        self.failing: set[str] = set()
        self.applied: list[bytes] = []
        self.busy = 0
        self.most_busy = 0
        self.random = random.Random(30)

    @property  # type: ignore[override]
    def delay_seconds(self) -> float:
        return self.base + self.random.random() * self.jitter

    @delay_seconds.setter
    def delay_seconds(self, value: float) -> None:
        self.base = value

    def answer(self, payload: bytes) -> bytes:
        if any(f"|{p}^".encode() in payload for p in self.failing):
            code, self.ack_code = self.ack_code, "AE"
            try:
                return super().answer(payload)
            finally:
                self.ack_code = code
        self.applied.append(payload)
        return super().answer(payload)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.busy += 1
        self.most_busy = max(self.most_busy, self.busy)
        try:
            await super()._handle(reader, writer)
        finally:
            self.busy -= 1


def config(port: int, lanes: int, **changes: Any) -> WorkerConfig:
    return worker_config(DEST, port, channel="adt", lanes=lanes, **changes)


async def enqueue(dsn: str, sent: Sequence[Sent]) -> list[int]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await queue.enqueue(
            conn, [NewItem(DEST, "adt", s.control_id, "ADT^A08", s.payload) for s in sent]
        )


async def count_states(dsn: str) -> dict[str, int]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT state, count(*) FROM inturn_delivery GROUP BY state")
        return {str(r[0]): int(r[1]) for r in await cur.fetchall()}


async def until_delivered(dsn: str, n: int, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while (await count_states(dsn)).get("delivered", 0) < n:
            await asyncio.sleep(0.05)


def control_id(payload: bytes) -> str:
    return payload.split(b"|")[9].decode()


def reorders(sent: Sequence[Sent], received: Sequence[bytes]) -> list[tuple[str, str]]:
    """Pairs of messages that must keep their order but arrived the other way round (every
    arrival of the earlier one must come before every arrival of the later one)."""
    order = {s.control_id: i for i, s in enumerate(sent)}
    keys = {s.control_id: tuple(index_keys(s.payload)) for s in sent}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for position, payload in enumerate(received):
        cid = control_id(payload)
        first.setdefault(cid, position)
        last[cid] = position
    arrived = sorted(first, key=order.__getitem__)
    wrong = []
    for i, a in enumerate(arrived):
        for b in arrived[i + 1 :]:
            if conflict(keys[a], keys[b]) and last[a] > first[b]:
                wrong.append((a, b))
    return wrong


async def test_eight_lanes_keep_every_patients_order_through_merges(fresh_db: str) -> None:
    sent = feed(400, patients=40, merge_every=50)
    async with Receiver(0.01, 0.02) as rx:
        await enqueue(fresh_db, sent)
        async with running(config(rx.port, 8), fresh_db):
            await until_delivered(fresh_db, len(sent))
    assert sorted(map(control_id, rx.applied)) == sorted(s.control_id for s in sent)
    assert reorders(sent, rx.applied) == []
    assert rx.connections == 8 and rx.most_busy == 8  # eight lanes, eight connections


async def test_a_failing_patient_holds_only_its_own_messages(fresh_db: str) -> None:
    sent = feed(120, patients=12)
    async with Receiver(0.0, 0.01) as rx:
        rx.failing = {"P7"}
        ids = await enqueue(fresh_db, sent)
        async with running(config(rx.port, 4), fresh_db) as worker:
            # every other patient's messages go while P7's first one fails and backs off
            await until_delivered(fresh_db, 110)
            assert (await count_states(fresh_db)) == {"delivered": 110, "pending": 10}
            view = worker.state.lanes
            assert view is not None and view.hold is not None
            assert view.hold.reason in ("backoff", "key")
            code, _, body = make_app([worker]).answer("/lanes")
            assert code == 200 and body.decode().startswith(f"{DEST}: 0 of 4 lanes sending")
            assert "oldest waiting id=" in body.decode()
            # /metrics: P7's ten messages wait (the first backs off, the others behind it)
            async with asyncio.timeout(10):
                while (
                    REGISTRY.get_sample_value("inturn_lanes_waiting", {"destination": DEST}) != 10
                ):
                    await asyncio.sleep(0.05)
            # what people see, from the rows alone: no head; the oldest waiting is P7's first
            async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                summary = summarize(await reads.lane_window(conn, DEST), 4, 1000)
            first = min(i for i, s in zip(ids, sent, strict=True) if b"|P7^" in s.payload)
            assert summary.heads == () and summary.hold == Hold(first, "backoff")
            assert "its last attempt failed" in summary.describe()
            rx.failing = set()
            await until_delivered(fresh_db, 120)
    assert reorders(sent, rx.applied) == []
    p7 = [control_id(p) for p in rx.applied if b"|P7^" in p]
    assert p7 == [s.control_id for s in sent if b"|P7^" in s.payload]


async def test_a_barrier_and_a_merge_are_ordered_against_everything_they_must_be(
    fresh_db: str,
) -> None:
    sent = [
        *(adt(n, n % 5) for n in range(20)),
        master_file(20),  # no patient: a barrier
        *(adt(n, n % 5) for n in range(21, 40)),
        merge(40, 1, 2),
        *(adt(n, n % 5) for n in range(41, 60)),
    ]
    async with Receiver(0.0, 0.02) as rx:
        await enqueue(fresh_db, sent)
        async with running(config(rx.port, 8), fresh_db):
            await until_delivered(fresh_db, len(sent))
    got = [control_id(p) for p in rx.applied]
    assert reorders(sent, rx.applied) == []
    barrier = got.index("M000020")
    assert sorted(got[:barrier]) == [f"M{n:06d}" for n in range(20)]
    assert rx.most_busy > 1


async def test_a_worker_killed_mid_flight_resends_at_most_one_per_lane(fresh_db: str) -> None:
    sent = feed(200, patients=30, merge_every=50)
    async with Receiver(0.02, 0.05) as rx:
        await enqueue(fresh_db, sent)
        cfg = config(rx.port, 8)
        worker = DestinationWorker(cfg, fresh_db, MllpSender(cfg.sender), PrometheusObserver())
        task = asyncio.create_task(worker.run(asyncio.Event()))
        await rx.wait_for(60)
        task.cancel()  # killed: no answer of the attempts in flight is recorded
        with contextlib.suppress(asyncio.CancelledError):
            await task
        async with running(config(rx.port, 8), fresh_db):
            await until_delivered(fresh_db, len(sent))
    assert reorders(sent, rx.applied) == []
    duplicates = len(rx.applied) - len(sent)
    assert 0 <= duplicates <= 8


async def test_changing_the_lane_count_while_a_backlog_waits_keeps_every_keys_order(
    fresh_db: str,
) -> None:
    sent = feed(300, patients=25, merge_every=50)
    async with Receiver(0.0, 0.02) as rx:
        await enqueue(fresh_db, sent)
        delivered = 0
        for lanes in (8, 3, 1, 5):
            async with running(config(rx.port, lanes), fresh_db):
                delivered += 50
                await until_delivered(fresh_db, min(delivered, len(sent)))
        async with running(config(rx.port, 8), fresh_db):
            await until_delivered(fresh_db, len(sent))
    assert reorders(sent, rx.applied) == []
    assert len(rx.applied) == len(sent)  # a clean stop marks what it sent: no duplicate


async def test_skip_and_erase_while_lanes_run(fresh_db: str) -> None:
    sent = feed(60, patients=6)
    async with Receiver(0.0, 0.01) as rx:
        rx.failing = {"P0"}
        ids = await enqueue(fresh_db, sent)
        async with running(config(rx.port, 4), fresh_db):
            await until_delivered(fresh_db, 50)
            async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                skipped = await actions.skip(conn, ids[0], who="test", why="wrong patient")
            assert skipped
            rx.failing = set()
            await until_delivered(fresh_db, 59)
    assert (await count_states(fresh_db)) == {"delivered": 59, "skipped": 1}
    assert reorders(sent[1:], rx.applied) == []
    assert "M000000" not in map(control_id, rx.applied)


async def test_lanes_whose_lease_is_taken_over_send_nothing_more(fresh_db: str) -> None:
    """The lanes share the worker's one lease: taken over, no lane starts another message; the
    answers in flight are not recorded (they stay pending for the holder)."""
    sent = feed(40, patients=10)
    async with (
        Receiver(0.3, 0.0) as rx,
        running(config(rx.port, 4), fresh_db, lease=QUICK_LEASE) as w,
    ):
        await enqueue(fresh_db, sent)
        await rx.wait_for(4)  # four lanes in flight
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as admin:
            await admin.execute(
                "UPDATE inturn_lease SET holder = 'thief', epoch = epoch + 1,"
                " expires_at = clock_timestamp() + interval '60 s' WHERE destination = %s",
                (DEST,),
            )
            async with asyncio.timeout(10):
                while w.state.lock_held:
                    await asyncio.sleep(0.05)
            arrived = len(rx.received)
            await asyncio.sleep(1.0)
            assert len(rx.received) == arrived <= 8  # nothing started under a stale epoch
            assert (await count_states(fresh_db)).get("delivered", 0) <= 4


async def test_what_the_lanes_hold_is_shown_to_people(fresh_db: str) -> None:
    """``queue depth`` (the registry's lane count, the lanes' heads and what holds the oldest
    waiting message) and the Destination status's depth, from the rows alone."""
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await register(conn, DEST, "adt", lanes=4)
    sent = [adt(0, 1), adt(1, 2), merge(2, 2, 3), adt(3, 3), adt(4, 4), master_file(5), adt(6, 5)]
    ids = await enqueue(fresh_db, sent)
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        [row] = await reads.depth(conn)
        assert row.lanes == 4
        summary = summarize(await reads.lane_window(conn, DEST), row.lanes, 1000)
        depth = (await registry.status_depth(conn))[DEST]
    assert depth.lanes == 4
    # P1 and P2 go; the merge of P2 and P3 waits for P2's message; P3's waits for the merge;
    # P4 goes; the master file waits for everything before it, and P5's for the master file
    assert summary.heads == (ids[0], ids[1], ids[4])
    assert summary.hold == Hold(ids[2], "binding", ids[1])
    assert summary.to_json() == {
        "count": 4,
        "heads": [ids[0], ids[1], ids[4]],
        "windowFull": False,
        "oldestWaiting": {
            "id": ids[2],
            "reason": "binding",
            "behind": ids[1],
            "text": f"behind id={ids[1]}: a message naming several patients binds them",
        },
    }
    out = subprocess.run(
        [INTURN, "queue", "depth", "--dsn", fresh_db],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert f"{DEST}: 4 lanes: heads {ids[0]}, {ids[1]}, {ids[4]}; oldest waiting id={ids[2]}" in out
    listed = json.loads(
        subprocess.run(
            [INTURN, "queue", "depth", "--json", "--dsn", fresh_db],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    assert listed[0]["lanes"] == 4 and listed[0]["laneView"] == summary.to_json()


async def test_a_hold_stops_every_lane_and_resuming_keeps_the_order(fresh_db: str) -> None:
    """``queue suspend`` (the console's hold) with lanes: nothing new starts on any lane after
    the messages in flight and those taken ahead; resumed, the rest go, each patient in order."""
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await register(conn, DEST, "adt", lanes=4)
    sent = feed(200, patients=20, merge_every=25)
    async with Receiver(0.02, 0.01) as rx:
        await enqueue(fresh_db, sent)
        async with running(config(rx.port, 4), fresh_db):
            await rx.wait_for(20)
            async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                assert await registry.suspend(conn, DEST, who="test", why="upgrade")
                await asyncio.sleep(1.0)  # in flight and taken ahead finish
                arrived = len(rx.received)
                await asyncio.sleep(1.5)
                assert len(rx.received) == arrived < len(sent)
                assert await registry.resume(conn, DEST, who="test")
            await until_delivered(fresh_db, len(sent))
    assert reorders(sent, rx.applied) == []


class SlowHttp(HttpReceiver):
    """An HTTP receiver answering each request after a random 0-20 ms, applying it then, and
    counting the requests it holds at once."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: list[bytes] = []
        self.busy = self.most_busy = 0
        self.random = random.Random(31)

    async def _handle(self, request: web.Request) -> web.Response:
        self.busy += 1
        self.most_busy = max(self.most_busy, self.busy)
        try:
            body = await request.read()
            await asyncio.sleep(self.random.random() * 0.02)
            self.applied.append(body)
            return web.Response(status=200)
        finally:
            self.busy -= 1


async def test_http_sends_up_to_count_requests_at_once_in_each_patients_order(
    fresh_db: str,
) -> None:
    sent = feed(150, patients=15, merge_every=30)
    async with SlowHttp() as rx:
        await enqueue(fresh_db, sent)
        cfg = worker_config(DEST, HttpSenderConfig(rx.url), channel="adt", lanes=4)
        async with running(cfg, fresh_db):
            await until_delivered(fresh_db, len(sent))
    assert reorders(sent, rx.applied) == []
    assert rx.most_busy == 4  # four requests at once, never more


def lanes_manifest(directory: Path, port: int, lanes: int) -> Path:
    path = directory / "destination.yaml"
    path.write_text(
        "apiVersion: inturn.dev/v1alpha1\n"
        "kind: Destination\n"
        "metadata: {name: lanes, namespace: ward}\n"
        "spec:\n"
        "  channel: adt\n"
        f"  sender: {{mllp: {{host: 127.0.0.1, port: {port}}}}}\n"
        "  retry: {maxAttempts: 0, backoffSeconds: 1, maxBackoffSeconds: 1, timeoutSeconds: 2}\n"
        "  idleSeconds: 1\n"
        f"  lanes: {{count: {lanes}}}\n"
    )
    return path


@pytest.mark.acceptance  # whole worker processes
async def test_a_worker_process_killed_mid_flight_resends_at_most_one_per_lane(
    fresh_db: str, tmp_path: Path
) -> None:
    """``inturn worker`` with 8 lanes, killed (SIGKILL) while its lanes are sending: the next
    process sends what was in flight again (at most one duplicate per lane) and every patient's
    order holds through the merges."""
    sent = feed(300, patients=40, merge_every=50)
    env = {**os.environ, "INTURN_DSN": fresh_db, "INTURN_LEASE_TTL_SECONDS": "3",
           "INTURN_LEASE_RENEW_SECONDS": "1", "INTURN_LEASE_ACQUIRE_SECONDS": "0.5"}  # fmt: skip
    async with Receiver(0.03, 0.03) as rx:
        await enqueue(fresh_db, sent)
        path = lanes_manifest(tmp_path, rx.port, 8)
        command = [INTURN, "worker", "-f", str(path), "--http-port", "0", "--log-level", "WARNING"]
        first = await asyncio.create_subprocess_exec(*command, env=env)
        try:
            await rx.wait_for(80, timeout=60)
        finally:
            first.kill()  # mid-flight: the answers of what its lanes were sending are lost
            await asyncio.wait_for(first.wait(), 30)
        second = await asyncio.create_subprocess_exec(*command, env=env)
        try:
            await until_delivered(fresh_db, len(sent), timeout=120)
        finally:
            second.terminate()
            await asyncio.wait_for(second.wait(), 30)
    assert reorders(sent, rx.applied) == []
    assert sorted(set(map(control_id, rx.applied))) == sorted(s.control_id for s in sent)
    assert 0 <= len(rx.applied) - len(sent) <= 8


async def test_a_receiver_that_is_down_gets_one_attempt_per_backoff_step_from_all_lanes(
    fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Four lanes and a closed port: the first failure holds every lane for the backoff (1 s),
    then one lane tries, so the connection attempts are at most the lanes' first burst and one
    per second after it, one log line each (not one per patient's head on every lane); when the
    receiver comes up everything is delivered, each patient in order, no attempt counted."""
    caplog.set_level(logging.INFO, logger="inturn.drain")
    sent = feed(300, patients=100)
    rx = Receiver()
    await rx.start()
    await rx.stop()  # its port, with nothing on it
    labels = {"destination": DEST, "cause": "unreachable"}

    def failures() -> float:
        return REGISTRY.get_sample_value("inturn_retries_total", labels) or 0.0

    before = failures()
    await enqueue(fresh_db, sent)
    loop = asyncio.get_running_loop()
    async with running(config(rx.port, 4), fresh_db) as worker:
        started = loop.time()
        await asyncio.sleep(5.0)
        seen = []  # what /lanes says meanwhile: every lane waits for the receiver
        while len(seen) < 20 and loop.time() - started < 10:
            view = worker.state.lanes
            seen.append("" if view is None else view.describe())
            await asyncio.sleep(0.05)
        assert any("the receiver is unreachable: every lane waits, next try in" in s for s in seen)
        elapsed = loop.time() - started
        attempts = failures() - before
        lines = [r.getMessage() for r in caplog.records if "unreachable (" in r.getMessage()]
        await rx.start()
        try:
            await until_delivered(fresh_db, len(sent))
        finally:
            await rx.stop()
    print(f"4 lanes, closed port, {elapsed:.1f} s: {attempts:g} attempts, {len(lines)} lines")
    # backoff 1 s (FAST_RETRY): the first burst of at most 4, then one per step
    assert 2 <= attempts <= 4 + elapsed + 1
    assert 2 <= len(lines) <= elapsed + 2
    assert sorted(map(control_id, rx.applied)) == sorted(s.control_id for s in sent)
    assert reorders(sent, rx.applied) == []
    states = await count_states(fresh_db)
    assert states == {"delivered": len(sent)}
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        cur = await conn.execute("SELECT max(attempts) FROM inturn_delivery")
        assert await cur.fetchone() == (1,)  # no attempt of a held queue counted
