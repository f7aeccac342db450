"""The drain loop of a destination with several lanes (``spec.lanes.count`` above 1).

One worker still holds the destination (its lock, and its lease); the lanes are tasks of that
worker. Each lane has its own sender (an MLLP connection, an HTTP client), and sends one message
at a time; the loop here is the only user of the worker's database connection, so every
statement stays in order on one session:

1. read the window: the oldest pending messages with their lane keys
   (:func:`inturn.worker.store.delivery.pending_window`), kept in memory between turns and read
   again after a notification (the tail at once, the whole window at most every
   :data:`FULL_REFRESH_SECONDS`, so that a skip, a retry-now or an erasure is seen);
2. ask the scheduler (:func:`inturn.worker.drain.lanes.plan`) which messages may start on the
   free lanes; take their payloads (:func:`inturn.worker.store.delivery.take`) and start them.
   The same take reads the messages that may go next (at most one per lane, kept
   :data:`AHEAD_SECONDS`), so that a lane that answers gets its next message without waiting
   for a round trip;
3. wait for an answer, a notification, a message coming due, or the idle poll;
4. record each answer: a failure at once, per id (the worker's own retry decision and marks,
   :meth:`DestinationWorker._failed`); the deliveries of a turn with the next take, in the same
   statement (:func:`inturn.worker.store.delivery.take`), which commits them before anything it
   takes is sent: one round trip per turn, however many lanes answered.

A receiver that is unreachable (no connection: refused, DNS, TLS, none within the attempt's
timeout) holds the destination, not one patient: after such a failure no lane starts anything
until its backoff is over (:attr:`LaneDrain.held_until`), the receiver is probed meanwhile as
one stream's is, and until a message is delivered again one lane at a time tries: one
connection attempt and one log line per backoff step, as with one stream. A failure that is the
message's (AE, AR, no answer, a connection lost after the message was written) holds only its
patient.

What stays as with one lane: the throttle paces the destination as a whole; outside its
delivery window, or suspended, or on hold, nothing new starts (what is in flight finishes); a
stop lets the attempts in flight finish and be marked, a second signal abandons them (they stay
pending). There is no in-flight state in the database: a worker killed mid-flight leaves every
lane's message pending, so each may be sent once more by the next holder (at most one duplicate
per lane and lost session, never a reorder: a message's key stays held while it is pending).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg import AsyncConnection

from inturn.worker import tracing
from inturn.worker.drain.attempt import send_once
from inturn.worker.drain.lanes import Entry, LaneView, Plan, hold, plan
from inturn.worker.drain.steps import SessionLost
from inturn.worker.senders.base import FailureCause, Sender
from inturn.worker.senders.registry import make_sender
from inturn.worker.store import delivery
from inturn.worker.store import lease as leases
from inturn.worker.store.lease import Lease
from inturn.worker.store.model import Head, Pending

if TYPE_CHECKING:
    from inturn.worker.drain.runner import DestinationWorker

log = logging.getLogger("inturn.drain")

#: Most seconds between two full reads of the window while messages are pending (a notification
#: or a message coming due asks for one; in between only the window's tail is read).
FULL_REFRESH_SECONDS = 1.0
#: Longest a head taken ahead (with the previous take) may wait to be sent without being read
#: again. A skip, an erasure or a hold that lands within it may miss such a message, as it
#: misses a message already being sent (the single stream's next head, read with the delivered
#: mark, has the same race, for less time).
AHEAD_SECONDS = 0.25
#: Most payload bytes held taken ahead, all lanes together (a message larger than what is left
#: of it is not taken ahead, only when it goes): the worker holds at most the payloads in
#: flight (one per lane) and this.
AHEAD_MAX_BYTES = 4 * 1024 * 1024
#: Seconds between two warnings that the window is full of waiting messages.
WINDOW_FULL_LOG_EVERY_SECONDS = 60.0


@dataclass
class Flight:
    """One message being sent on one lane.

    Attributes:
        lane: the lane (0 to count - 1); head: the message; payload: its bytes as sent (opened,
        when the row holds an envelope); started: ``time.monotonic()`` at its start; task: the
        send, whose result is None (accepted) or ``(outcome, detail)``.
    """

    lane: int
    head: Head
    payload: bytes
    started: float
    task: asyncio.Task[tuple[FailureCause, str] | None]
    trace: tracing.Attempt | None


async def _answered(
    failure: tuple[FailureCause, str],
) -> tuple[FailureCause, str] | None:
    """A lane's answer known before any send (a refusal by the destination's profile)."""
    return failure


class LaneDrain:
    """Drains one destination on ``config.lanes`` lanes until stopped.

    Args:
        worker: the destination's worker (its configuration, sender, step runner, observer,
            retry decision and health).
        conn: the worker's session (holding the destination's lock).
        stop: set to stop: nothing new starts; the attempts in flight finish and are marked.
        lease: the worker's lease of the destination: every statement is guarded by it (and
            renews it when the renewal is due); an attempt starts only while it outlives the
            attempt timeout.
    """

    def __init__(
        self,
        worker: DestinationWorker,
        conn: AsyncConnection[Any],
        stop: asyncio.Event,
        *,
        lease: Lease,
    ) -> None:
        self.w = worker
        self.conn = conn
        self.stop = stop
        self.lease = lease
        self.count = worker.config.lanes
        self.limit = worker.config.lanes_window
        #: Lane 0 is the worker's own sender; the others are made from the same settings.
        self.senders: list[Sender] = [worker.sender]
        self.window: dict[int, Entry] = {}
        #: Payload sizes of the window's messages (bytes), for the take-ahead budget.
        self.sizes: dict[int, int] = {}
        #: The last read of the window returned fewer rows than asked: it holds every pending item.
        self.complete = False
        self.flights: dict[int, Flight] = {}
        self.wake = asyncio.Event()
        self._last_full = 0.0
        self._want_full = True
        self._full_logged = 0.0
        #: Deliveries answered but not marked yet: (flight, attempts, expected replies, the
        #: unreachable run it ended); marked by the next :meth:`_take`, before any send.
        self._answered: list[tuple[Flight, int, Sequence[Any], int]] = []
        #: Heads taken ahead (at most ``count``): the messages that may go next, read with the
        #: previous take, so that a lane that answers is given its next message at once.
        self.ahead: dict[int, tuple[float, Head]] = {}
        #: ``time.monotonic()`` until which no lane starts anything: the backoff of the last
        #: failure that said the receiver is unreachable (0: none); ``held_at``: when it began
        #: (the attempts started before it met the same outage).
        self.held_until = 0.0
        self.held_at = 0.0

    async def run(self) -> None:
        """Drain until stopped (and the attempts in flight are marked), or the session is lost.

        Raises:
            inturn.worker.drain.steps.SessionLost: the session is gone (the worker reconnects;
                the messages in flight finish first, and those the receiver acknowledged are
                marked by the next session of this process, not sent again).
            inturn.worker.store.lease.LeaseLost: another worker took the destination over
                (nothing more is sent; the answers still in flight are not recorded).
        """
        watcher = asyncio.create_task(self._watch_stop())
        try:
            config = self.w.config
            self.senders += [
                make_sender(config.sender, body_charset=config.body_charset)
                for _ in range(self.count - 1)
            ]
            await self._loop()
        except SessionLost:
            await self._settle_in_flight()
            raise
        finally:
            watcher.cancel()
            for flight in self.flights.values():
                flight.task.cancel()
            for flight in list(self.flights.values()):
                with contextlib.suppress(BaseException):
                    await flight.task
            self.flights.clear()
            self.w.state.sending_since = None
            self.w.state.lanes = None
            for sender in self.senders[1:]:
                with contextlib.suppress(Exception):
                    await sender.close()

    async def _settle_in_flight(self) -> None:
        """The session is lost with messages in flight: let their sends finish (each within
        its attempt timeout) and remember those the receiver acknowledged (:attr:`unmarked` of
        the worker), so that the next session marks them instead of sending them again."""
        if not self.flights:
            return
        tasks = [f.task for f in self.flights.values()]
        await asyncio.wait(tasks, timeout=self.w.config.retry.timeout_seconds + 1.0)
        mark = self.w.marker
        for flight in self.flights.values():
            task = flight.task
            if not task.done() or task.cancelled() or task.exception() is not None:
                continue
            if task.result() is None:  # acknowledged: its mark is written next session
                item = flight.head.item
                expecting = () if mark is None else mark(item.message_type, flight.payload)
                self.w.unmarked[item.id] = delivery.Delivered(item, item.attempts + 1, expecting)

    async def _watch_stop(self) -> None:
        await self.stop.wait()
        self.wake.set()

    # --- the loop ---------------------------------------------------------------------------

    async def _loop(self) -> None:
        idle = float(self.w.config.idle_seconds)
        while True:
            self.w.state.last_tick = time.monotonic()
            await self._record_answers()
            if self.stop.is_set():
                await self._flush()
                if not self.flights:
                    return
                await self._wait(None)
                continue
            gate = self.w._gate()
            if self.w.config.suspend or gate.hold == "window":
                self.w._say_held(gate if gate.hold == "window" else None)
                await self._flush()
                await self.w._keep_lease(self.conn, self.stop, self.lease)
                await self.w._report_depth(self.conn, self.stop)
                self._publish(None)
                held = idle if self.w.config.suspend else gate.wait_seconds
                await self._wait(self.w._idle_for(held))
                continue
            self.w._say_held(None)
            await self.w._keep_lease(self.conn, self.stop, self.lease)  # when it is due
            if self._want_full or not self.window:
                pulled = await self.w._guarded_due(self.conn, self.stop, "head", self._pull_once)
                if pulled:
                    self.complete = False  # the channel log had messages for it: read the tail
            later = await self._read_window()
            self.w.state.db_ok = True
            timeout = await self._start()
            if not self.window and not self.flights:
                self.w._report_empty()
            else:
                await self.w._report_depth(self.conn, self.stop)
            soonest = min(t for t in (idle, timeout, later) if t is not None)
            if self.w._unreachable_run and not self.flights and await self._probe(soonest):
                continue  # the receiver is back: what it held goes now
            await self._wait(self.w._idle_for(soonest) if not self.flights else soonest)

    async def _probe(self, seconds: float) -> bool:
        """While every lane waits out the backoff of an unreachable receiver: probe it (as the
        single stream does, :meth:`SingleStream._probe_until`) for up to ``seconds``; once it
        accepts a connection, the rows it held are due at once (the window's and the table's)
        and True is returned. Rows backing off after a refusal keep their backoff."""
        if not await self.w._probe_until(self.stop, seconds):
            return False
        self.held_until = 0.0  # one lane tries first (:meth:`_room`), the rest once it is through
        made = await self.w._guarded(
            self.conn,
            self.stop,
            "head",
            lambda: delivery.make_due_unreachable(self.conn, self.w.destination, lease=self.lease),
        )
        now = time.monotonic()
        for item_id in made:
            entry = self.window.get(item_id)
            if entry is not None:
                self.window[item_id] = Entry(item_id, entry.keys, now)
        # and the whole window read again at once, with each row's due time as the table has
        # it (a row whose hold ran out meanwhile, or one tried while the probe ran)
        self._want_full, self._last_full = True, 0.0
        return True

    async def _start(self) -> float | None:
        """Plan, take and start what may go now; the seconds after which to look again."""
        now = time.monotonic()
        if self.w._unreachable_run and now < self.held_until:  # the receiver's backoff
            await self._flush()
            self._publish(None)
            return self.held_until - now
        if self._room() <= 0:  # every lane is sending (or the one trying): an answer wakes
            await self._flush()
            self._publish(None)
            return None
        # a delivered message's keys stay held until its mark is durable (the next take)
        held = {i: f.head.keys for i, f in self.flights.items()}
        held.update((f.head.item.id, f.head.keys) for f, *_ in self._answered)
        entries = list(self.window.values())
        chosen = plan(entries, held, self._room(), now, self.limit)
        timeout = chosen.wake_in
        ids = list(chosen.start)
        if ids and self.w.config.messages_per_second is not None:
            ids, wait = self._throttled(ids)
            if wait is not None:
                timeout = wait if timeout is None else min(timeout, wait)
        if ids and not await self._lease_outlives_attempt():
            ids = []
            timeout = 0.0  # the renewal itself was too slow: look again at once
            await self._flush()
        for item_id, (taken_at, _) in list(self.ahead.items()):
            if now - taken_at > AHEAD_SECONDS:  # too old to trust: taken again if chosen
                del self.ahead[item_id]
        now_ahead = [i for i in ids if i in self.ahead]
        flushed = bool(now_ahead and self._answered)
        if flushed:
            # an answered message's mark commits before a message taken ahead starts on its
            # lane: the answers not marked yet and the lanes in flight would otherwise be more
            # than one message a lane to send again after a lost session
            await self._flush()
        for item_id in now_ahead:  # taken ahead: go now
            await self._open_and_launch(self.ahead.pop(item_id)[1])
        rest = [i for i in ids if i not in self.flights]
        if rest or self._answered:
            going = {**held, **{i: self.window[i].keys for i in rest}}
            going.update((i, f.head.keys) for i, f in self.flights.items())
            later = plan(entries, going, self.count, now, self.limit).start
            # nothing taken ahead while the receiver is unreachable: one message tries
            ahead = [] if self.w._unreachable_run else self._ahead_of(later)
            marked = bool(self._answered)
            heads = await self._take(rest + ahead)
            taken = {h.item.id for h in heads}
            for item_id in rest + ahead:
                if item_id not in taken:  # skipped or erased since the window was read
                    self._forget(item_id)
            for head in heads:
                if head.item.id in rest:
                    await self._open_and_launch(head)
                else:
                    self.ahead[head.item.id] = (now, head)
            if marked and self._free() > 0:
                self.wake.set()  # their keys are free now: look again at once
        if flushed and self._free() > 0:
            self.wake.set()  # the keys of the answers marked above are free too
        self._publish(chosen)
        if chosen.window_full:
            self._say_window_full()
        return timeout

    def _forget(self, item_id: int) -> None:
        """``item_id`` left the window (delivered, given up, skipped or erased)."""
        self.window.pop(item_id, None)
        self.sizes.pop(item_id, None)

    def _ahead_of(self, later: Sequence[int]) -> list[int]:
        """Which of ``later`` to take ahead: at most one per lane in all, within
        :data:`AHEAD_MAX_BYTES`."""
        room = AHEAD_MAX_BYTES - sum(len(h.payload) for _, h in self.ahead.values())
        chosen: list[int] = []
        for item_id in later:
            if len(self.ahead) + len(chosen) >= self.count:
                break
            size = self.sizes.get(item_id, AHEAD_MAX_BYTES + 1)
            if item_id in self.ahead or size > room:
                continue
            chosen.append(item_id)
            room -= size
        return chosen

    async def _open_and_launch(self, head: Head) -> None:
        """Open ``head``'s payload right before its send (ciphertext is never sent: an envelope
        this process cannot open is held like a failing patient, its lane keys wait; a
        plaintext row passes unchanged), and send it on a free lane."""
        payload = await self.w._open_or_hold(self.conn, self.stop, head, self.lease)
        if isinstance(payload, bytes):
            if self.w.config.profile is None:
                self._launch(head, payload)
                return
            # spec.profile: what its receiver gets, or its refusal recorded as the lane's answer
            shaped = await self.w._for_receiver(self.conn, self.stop, head, payload, self.lease)
            if isinstance(shaped, bytes):
                self._launch(head, shaped)
            else:
                self._launch(head, payload, refused=shaped)
        elif (entry := self.window.get(head.item.id)) is not None:
            self.window[entry.id] = Entry(entry.id, entry.keys, time.monotonic() + payload)

    async def _lease_outlives_attempt(self) -> bool:
        """Whether the lease is surely valid for longer than an attempt (renewed first when
        not), as a single stream's attempt requires."""
        timeout = float(self.w.config.retry.timeout_seconds)
        if self.w._lease_left() > timeout:
            return True
        ttl = self.w.lease_settings.ttl_seconds
        await self.w._guarded(
            self.conn, self.stop, "head", lambda: leases.renew(self.conn, self.lease, ttl)
        )
        return self.w._lease_left() > timeout

    def _throttled(self, ids: list[int]) -> tuple[list[int], float | None]:
        """``spec.throttle`` for the destination as a whole: at most one start per gate opening;
        the rest wait in order (they stay first in the window)."""
        gate = self.w._gate()
        if gate.hold == "throttle":
            return [], gate.wait_seconds
        self.w._last_send = time.monotonic()
        return ids[:1], (self.w._gate().wait_seconds if len(ids) > 1 else None)

    def _free(self) -> int:
        return self.count - len(self.flights)

    def _room(self) -> int:
        """How many may start now: the free lanes; while the receiver is unreachable (its last
        connection failed, nothing delivered since), one, and only when nothing is in flight."""
        if self.w._unreachable_run:
            return 0 if self.flights else 1
        return self._free()

    def _launch(
        self, head: Head, payload: bytes, refused: tuple[FailureCause, str] | None = None
    ) -> None:
        """Start ``payload`` (as its receiver gets it) on a free lane; ``refused``: the profile
        refused it, and the lane's answer is that refusal (nothing is sent)."""
        busy = {f.lane for f in self.flights.values()}
        lane = min(set(range(self.count)) - busy)
        item = head.item
        trace = tracing.attempt_started(
            self.w.destination,
            item.id,
            item.control_id,
            head.traceparent,
            item.attempts + 1,
            self.w.peer,
        )
        task = asyncio.create_task(
            send_once(self.senders[lane], payload, item.id, self.w.config.retry.timeout_seconds)
            if refused is None
            else _answered(refused)
        )
        task.add_done_callback(lambda _: self.wake.set())
        self.flights[item.id] = Flight(lane, head, payload, time.monotonic(), task, trace)
        self._sending()

    def _sending(self) -> None:
        starts = [f.started for f in self.flights.values()]
        self.w.state.sending_since = min(starts) if starts else None

    async def _wait(self, timeout: float | None) -> None:
        """Wait for an answer, a notification (the window is read again), stop, or
        ``timeout`` seconds (None: until an answer or stop)."""
        if not self.wake.is_set():
            limit = 3600.0 if timeout is None else timeout
            await self.w.steps.wait(self.conn, self.wake, limit)
            if not self.wake.is_set():  # a notification, or the time it waited for
                self._want_full = True
                self.ahead.clear()
        self.wake.clear()

    # --- the window -------------------------------------------------------------------------

    async def _pull_once(self, *, renew: bool) -> int:
        """One pull from the channel log (:func:`inturn.worker.store.delivery.pull`), renewing
        the lease with ``renew``."""
        pulled = await delivery.pull(
            self.conn, self.w.destination, self.w.config.channel, lease=self.lease, renew=renew
        )
        return pulled.count

    async def _read_window(self) -> float | None:
        """Read the window again, whole or its tail; returns the seconds after which a full
        read that is due but was put off may run (None when none is)."""
        now = time.monotonic()
        full = self._want_full and now - self._last_full >= FULL_REFRESH_SECONDS
        if not full and not self.window and not self.complete:
            full = True
        answered = {f.head.item.id for f, *_ in self._answered}  # delivered, mark to come
        if full:
            rows = await self._read(0, self.limit)
            self.window = {p.id: self._entry(p, now) for p in rows if p.id not in answered}
            self.sizes = {p.id: p.size for p in rows}
            self.ahead.clear()  # read again: a skip, a retry-now or an erasure may be why
            self.complete = len(rows) < self.limit
            self._last_full, self._want_full = now, False
            return None
        room = self.limit - len(self.window)
        # the tail is read when a notification came, or the window ran low (not per message)
        low = room >= self.limit // 2 or len(self.window) <= 4 * self.count
        if room > 0 and (self._want_full or (low and not self.complete)):
            after = max([0, *self.window, *self.flights, *answered])
            rows = await self._read(after, room)
            for p in rows:
                if p.id not in answered:
                    self.window[p.id] = self._entry(p, now)
                    self.sizes[p.id] = p.size
            self.complete = len(rows) < room
        if self._want_full:
            return max(0.0, self._last_full + FULL_REFRESH_SECONDS - now)
        return None

    async def _read(self, after: int, limit: int) -> list[Pending]:
        return await self.w._guarded_due(
            self.conn,
            self.stop,
            "head",
            lambda renew: delivery.pending_window(
                self.conn,
                self.w.destination,
                limit=limit,
                after=after,
                lease=self.lease,
                renew=renew,
            ),
        )

    @staticmethod
    def _entry(p: Pending, now: float) -> Entry:
        return Entry(p.id, p.keys, now + p.wait_seconds)

    # --- answers ----------------------------------------------------------------------------

    async def _record_answers(self) -> None:
        done = [f for f in self.flights.values() if f.task.done()]
        for flight in sorted(done, key=lambda f: f.head.item.id):
            await self._record(flight)
            del self.flights[flight.head.item.id]
        self._sending()

    async def _take(self, ids: list[int]) -> list[Head]:
        """Mark the answers of the turn delivered and take ``ids``, in one statement
        (:func:`inturn.worker.store.delivery.take`): the marks commit before anything taken is
        sent, so a message's successor never goes before its delivered mark is durable."""
        answered = self._answered
        delivered = [delivery.Delivered(f.head.item, a, e) for f, a, e, _ in answered]
        waited, heads = await self.w._guarded_due(
            self.conn,
            self.stop,
            "mark" if delivered else "head",
            lambda renew: delivery.take(
                self.conn,
                self.w.destination,
                ids,
                delivered=delivered,
                lease=self.lease,
                renew=renew,
            ),
            delivered[0].item.id if len(delivered) == 1 else None,
        )
        self._answered = []
        for d in delivered:
            self.w.unmarked.pop(d.item.id, None)
        for flight, attempts, _, held in answered:
            item = flight.head.item
            if attempts > 1 or held:
                log.info(
                    "destination %s: delivering again after %d failed attempt(s)%s"
                    " (id=%d, lane %d)",
                    self.w.destination,
                    attempts - 1,
                    f" and {held} unreachable" if held else "",
                    item.id,
                    flight.lane,
                )
            if waited.get(item.id) is not None:
                self.w.observer.delivered(self.w.destination, attempts, waited[item.id] or 0.0)
            tracing.finished(flight.trace, "delivered", attempts)
        return heads

    async def _flush(self) -> None:
        """Mark the answers not marked yet (nothing is taken)."""
        if self._answered:
            await self._take([])

    async def _record(self, flight: Flight) -> None:
        """Record one answer: a delivery is marked with the next take (:meth:`_take`); a
        failure is recorded now (a retry or a give-up)."""
        head, item = flight.head, flight.head.item
        attempts = item.attempts + 1
        failure = flight.task.result()
        outcome: FailureCause | None = None if failure is None else failure[0]
        self.w._attempted(flight.trace, outcome, flight.started)
        if failure is None:
            held, self.w._unreachable_run = self.w._unreachable_run, 0
            mark = self.w.marker  # what the packs add to its mark (spec.replies), or None
            expecting = () if mark is None else mark(item.message_type, flight.payload)
            self._answered.append((flight, attempts, expecting, held))
            # remembered until its mark commits (a lost session writes it first next time)
            self.w.unmarked[item.id] = delivery.Delivered(item, attempts, expecting)
            self._forget(item.id)
            return
        cause, detail = failure
        # an attempt that began before the destination was held met the same outage
        same = cause == "unreachable" and flight.started < self.held_at
        decision = await self.w._failed(
            self.conn, self.stop, head, attempts, cause, detail, self.lease, same_outage=same
        )
        if cause == "unreachable" and not decision.give_up:  # the receiver's: every lane waits
            now = time.monotonic()
            if not same:
                self.held_at = now
            self.held_until = max(self.held_until, now + decision.delay_seconds)
        if decision.give_up:
            self._forget(item.id)
            tracing.finished(flight.trace, "failed", attempts)
            return
        entry = self.window.get(item.id)
        if entry is not None:  # its key stays held while it backs off
            self.window[item.id] = Entry(
                item.id, entry.keys, time.monotonic() + decision.delay_seconds
            )
        # the item object carries its attempts: the next take reads them again

    # --- what is seen -----------------------------------------------------------------------

    def _publish(self, chosen: Plan | None) -> None:
        now = time.monotonic()
        if self.w._unreadable_run[0] and self.w._unreadable_run[0] not in self.window:
            self.w._unheld()  # the head held for its payload was skipped or erased
        in_flight = {i: f.head.keys for i, f in self.flights.items()}
        entries = list(self.window.values())
        why = hold(entries, in_flight, now) if entries else None
        view = self.w.state.lanes = LaneView(
            count=self.count,
            busy={f.lane: (i, now - f.started) for i, f in self.flights.items()},
            hold=why,
            waiting=len(entries) - sum(1 for i in in_flight if i in self.window),
            window_full=False if chosen is None else chosen.window_full,
            unreachable_for=(
                self.held_until - now if self.w._unreachable_run and now < self.held_until else None
            ),
        )
        self.w.observer.lanes(self.w.destination, len(view.busy), view.waiting, view.window_full)

    def _say_window_full(self) -> None:
        now = time.monotonic()
        if now - self._full_logged < WINDOW_FULL_LOG_EVERY_SECONDS:
            return
        self._full_logged = now
        log.warning(
            "destination %s: the lanes' window (%d oldest pending messages) is full of messages"
            " that wait for earlier ones; messages past it cannot go until it moves"
            " (spec.lanes.window)",
            self.w.destination,
            self.limit,
        )
