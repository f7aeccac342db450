"""The lane scheduler (inturn.worker.drain.lanes) against a model of a destination and its
receiver: a stateful property test.

The machine enqueues messages with random keys (one patient, a merge naming two or three, a
barrier without keys, a message whose identifiers were capped), asks the scheduler what may
start, lets the messages in flight reach the receiver (or not), succeed, fail and back off, be
given up, skipped, erased, resent after a restart (a lost session: the receiver may have it
already), and changes the lane count and the window bound between turns.

Every plan is compared with a brute-force oracle of the rules (the first startable messages in
enqueue order, up to the free lanes), and the receiver's log is checked after every step: for
any two messages that must keep their order (a shared key, or either a barrier), every arrival
of the earlier one comes before every arrival of the later one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from inturn.worker.drain.lanes import Entry, Hold, Plan, conflict, hold, is_barrier, plan
from inturn.worker.hl7.pid import CAPPED_KEY

#: slow (left out by make test-fast): a long model-based run
pytestmark = pytest.mark.slow

PATIENTS = ("p0", "p1", "p2", "p3", "p4")

keys_strategy = st.one_of(
    st.tuples(st.sampled_from(PATIENTS)),  # one patient
    st.sets(st.sampled_from(PATIENTS), min_size=2, max_size=3).map(lambda s: tuple(sorted(s))),
    st.just(()),  # no identifier: a barrier
    st.sampled_from(PATIENTS).map(lambda p: (p, CAPPED_KEY)),  # capped identifiers
)


@dataclass
class Message:
    id: int
    keys: tuple[str, ...]
    due: float = 0.0


@dataclass
class Flight:
    keys: tuple[str, ...]
    arrived: bool = False


@dataclass
class Destination:
    pending: dict[int, Message] = field(default_factory=dict)  # id order (insertion order)
    flights: dict[int, Flight] = field(default_factory=dict)
    enqueued: dict[int, tuple[str, ...]] = field(default_factory=dict)
    received: list[int] = field(default_factory=list)


def oracle(
    window: list[Entry], in_flight: dict[int, tuple[str, ...]], free: int, now: float
) -> list[int]:
    """The rules, written the slow way: each message against every other one."""
    startable = []
    for position, entry in enumerate(window):
        if entry.id in in_flight or entry.due > now:
            continue
        if any(conflict(e.keys, entry.keys) for e in window[:position]):
            continue
        if any(conflict(keys, entry.keys) for keys in in_flight.values()):
            continue
        startable.append(entry.id)
    return startable[: max(0, free)]


class LanesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.d = Destination()
        self.next_id = 1
        self.now = 0.0
        self.count = 8
        self.limit = 50
        self.duplicates_allowed = 0

    # --- what arrives ------------------------------------------------------------------------

    @rule(keys=keys_strategy, n=st.integers(1, 4))
    def enqueue(self, keys: tuple[str, ...], n: int) -> None:
        for _ in range(n):
            self.d.pending[self.next_id] = Message(self.next_id, keys, self.now)
            self.d.enqueued[self.next_id] = keys
            self.next_id += 1

    # --- the worker's turn ------------------------------------------------------------------------

    def window(self) -> list[Entry]:
        return [Entry(m.id, m.keys, m.due) for m in list(self.d.pending.values())[: self.limit]]

    @rule()
    def turn(self) -> None:
        chosen = self.checked_plan()
        for item_id in chosen.start:
            message = self.d.pending[item_id]
            # the global rule, beyond the window: nothing earlier and pending conflicts
            for other in self.d.pending.values():
                if other.id < item_id:
                    assert not conflict(other.keys, message.keys)
            self.d.flights[item_id] = Flight(message.keys)

    @invariant()
    def every_plan_follows_the_rules(self) -> None:
        self.checked_plan()

    def checked_plan(self) -> Plan:
        window = self.window()
        in_flight = {i: f.keys for i, f in self.d.flights.items()}
        free = self.count - len(in_flight)
        chosen = plan(window, in_flight, free, self.now, self.limit)
        assert list(chosen.start) == oracle(window, in_flight, free, self.now)
        full = len(window) >= self.limit and len(chosen.start) < max(0, free)
        assert chosen.window_full == full
        waiting_for_time = [
            e.due - self.now
            for p, e in enumerate(window)
            if e.id not in in_flight
            and e.due > self.now
            and not any(conflict(o.keys, e.keys) for o in window[:p])
            and not any(conflict(k, e.keys) for k in in_flight.values())
        ]
        if chosen.wake_in is not None:
            assert chosen.wake_in in waiting_for_time
        self.check_hold(window, in_flight, chosen.start)
        return chosen

    def check_hold(
        self, window: list[Entry], in_flight: dict[int, tuple[str, ...]], started: tuple[int, ...]
    ) -> None:
        why: Hold | None = hold(window, in_flight, self.now, started)
        going = set(in_flight) | set(started)
        rest = [e for e in window if e.id not in going]
        if not rest:
            assert why is None
            return
        assert why is not None and why.item_id == rest[0].id
        entry = rest[0]
        if why.behind is None:
            assert why.reason in ("backoff", "lanes")
        else:
            keys = self.d.enqueued[why.behind]
            assert why.behind < entry.id or why.behind in in_flight
            assert conflict(keys, entry.keys)
            if why.reason == "barrier":
                assert is_barrier(keys) or is_barrier(entry.keys)
            elif why.reason == "binding":
                assert len(keys) > 1 or len(entry.keys) > 1
                assert set(keys) != set(entry.keys)
            else:
                assert why.reason == "key" and set(keys) & set(entry.keys)

    # --- the receiver ------------------------------------------------------------------------

    @precondition(lambda self: self.d.flights)
    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        item_id = data.draw(st.sampled_from(sorted(self.d.flights)))
        flight = self.d.flights[item_id]
        if not flight.arrived:
            flight.arrived = True
            self.d.received.append(item_id)

    @precondition(lambda self: self.d.flights)
    @rule(data=st.data(), outcome=st.sampled_from(["delivered", "failed", "lost_ack", "gave_up"]))
    def answer(self, data: st.DataObject, outcome: str) -> None:
        item_id = data.draw(st.sampled_from(sorted(self.d.flights)))
        flight = self.d.flights.pop(item_id)
        if outcome in ("delivered", "lost_ack") and not flight.arrived:
            self.d.received.append(item_id)
        message = self.d.pending.get(item_id)
        if message is None:  # skipped or erased during its attempt: the mark changes nothing
            return
        if outcome in ("delivered", "gave_up"):
            del self.d.pending[item_id]
        else:  # failed (or an ACK lost after the receiver applied it): back off, send again
            message.due = self.now + data.draw(st.sampled_from([0.0, 1.0, 5.0]))

    # --- people and time ---------------------------------------------------------------------

    @precondition(lambda self: self.d.pending)
    @rule(data=st.data())
    def skip(self, data: st.DataObject) -> None:
        item_id = data.draw(st.sampled_from(sorted(self.d.pending)))
        del self.d.pending[item_id]  # a message in flight stays in flight until it returns

    @rule(patient=st.sampled_from(PATIENTS))
    def erase(self, patient: str) -> None:
        for item_id in [i for i, m in self.d.pending.items() if patient in m.keys]:
            del self.d.pending[item_id]

    @rule()
    def retry_now(self) -> None:
        for message in self.d.pending.values():
            message.due = self.now

    @rule()
    def restart(self) -> None:
        """A worker killed mid-flight: what it was sending may or may not have arrived; the
        rows stay pending and the next worker sends them again."""
        self.d.flights.clear()

    @rule(count=st.integers(1, 8))
    def change_count(self, count: int) -> None:
        self.count = count

    @rule(limit=st.integers(1, 12))
    def change_window(self, limit: int) -> None:
        self.limit = limit

    @rule(seconds=st.sampled_from([0.5, 1.0, 5.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    # --- what must hold -----------------------------------------------------------------------

    @invariant()
    def receiver_order_keeps_enqueue_order(self) -> None:
        arrivals: dict[int, list[int]] = {}
        for position, item_id in enumerate(self.d.received):
            arrivals.setdefault(item_id, []).append(position)
        ids = sorted(arrivals)
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                if conflict(self.d.enqueued[a], self.d.enqueued[b]):
                    assert max(arrivals[a]) < min(arrivals[b]), (a, b, self.d.received)

    @invariant()
    def per_key_enqueue_order(self) -> None:
        for patient in PATIENTS:
            seen = [i for i in self.d.received if patient in self.d.enqueued[i]]
            assert seen == sorted(seen)

    @invariant()
    def one_message_per_key_in_flight(self) -> None:
        flights = list(self.d.flights.items())
        for i, (a, fa) in enumerate(flights):
            for b, fb in flights[i + 1 :]:
                assert not conflict(fa.keys, fb.keys), (a, b)


LanesMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_lanes_against_the_model = LanesMachine.TestCase


def test_one_patient_failing_holds_only_its_own_messages() -> None:
    window = [
        Entry(1, ("a",), due=10.0),  # failing: backing off until t=10
        Entry(2, ("a",), due=0.0),
        Entry(3, ("b",), due=0.0),
        Entry(4, ("a", "c"), due=0.0),  # a merge naming a: waits
        Entry(5, ("c",), due=0.0),  # bound to the merge: waits
        Entry(6, ("d",), due=0.0),
    ]
    chosen = plan(window, {}, free=8, now=0.0, limit=100)
    assert chosen.start == (3, 6)
    assert chosen.wake_in == 10.0
    assert not chosen.window_full
    assert hold(window, {}, 0.0, chosen.start) == Hold(1, "backoff")
    assert hold(window[1:], {1: ("a",)}, 0.0) == Hold(2, "key", 1)
    assert hold(window[3:], {1: ("a",)}, 0.0) == Hold(4, "binding", 1)


def test_one_identifier_with_its_authority_is_one_patient_not_a_binding() -> None:
    """``PID|||PAT3^^^H`` gives two keys (with and without the authority): two messages of it
    wait as messages of one patient, not as a binding of several."""
    keys = ("PAT3", "PAT3^^^H")
    window = [Entry(3219, keys, due=10.0), Entry(3220, keys, due=0.0)]
    assert hold(window, {}, 0.0) == Hold(3219, "backoff")
    assert hold(window, {3219: keys}, 0.0) == Hold(3220, "key", 3219)
    merge = [Entry(1, ("a",), 0.0), Entry(2, ("a", "b"), 0.0)]
    assert hold(merge, {1: ("a",)}, 0.0) == Hold(2, "binding", 1)


def test_a_barrier_waits_for_everything_before_and_holds_everything_after() -> None:
    window = [Entry(1, ("a",), 0.0), Entry(2, (), 0.0), Entry(3, ("b",), 0.0)]
    assert plan(window, {}, 8, 0.0, 100).start == (1,)
    assert plan(window[1:], {1: ("a",)}, 7, 0.0, 100).start == ()
    assert hold(window[1:], {1: ("a",)}, 0.0) == Hold(2, "barrier", 1)
    assert plan(window[1:], {}, 8, 0.0, 100).start == (2,)
    assert plan(window[2:], {2: ()}, 7, 0.0, 100).start == ()
    capped = [Entry(7, ("a", CAPPED_KEY), 0.0), Entry(8, ("z",), 0.0)]
    assert plan(capped, {}, 8, 0.0, 100).start == (7,)
    assert plan(capped[1:], {7: capped[0].keys}, 7, 0.0, 100).start == ()


def test_a_window_full_of_waiting_messages_is_reported() -> None:
    window = [Entry(i, ("a",), 0.0) for i in range(1, 4)]
    chosen = plan(window, {}, 8, 0.0, limit=3)
    assert chosen.start == (1,) and chosen.window_full
    assert not plan(window, {}, 1, 0.0, limit=3).window_full  # every free lane got a message


def test_bad_windows_are_refused() -> None:
    with pytest.raises(ValueError, match="increasing"):
        plan([Entry(2, ("a",), 0.0), Entry(1, ("b",), 0.0)], {}, 2, 0.0, 10)
    with pytest.raises(ValueError, match="at least 1"):
        plan([], {}, 2, 0.0, 0)


def test_what_is_taken_ahead_is_bounded_by_lanes_and_bytes() -> None:
    """The lanes hold at most one payload per lane ahead, and at most AHEAD_MAX_BYTES of them
    (a larger message is read only when it goes)."""
    import asyncio

    from inturn.worker.drain import lane_runner
    from inturn.worker.drain.runner import DestinationWorker
    from inturn.worker.senders.mllp import MllpSender, MllpSenderConfig
    from inturn.worker.spec.config import RetryPolicy, WorkerConfig
    from inturn.worker.store.lease import Lease

    cfg = WorkerConfig(
        destination="ward/lanes",
        channel="adt",
        sender=MllpSenderConfig("127.0.0.1", 9),
        retry=RetryPolicy(max_attempts=0),
        lanes=3,
    )
    worker = DestinationWorker(cfg, "postgresql:///nowhere", MllpSender(cfg.sender))
    drain = lane_runner.LaneDrain(
        worker,
        None,
        asyncio.Event(),
        lease=Lease("ward/lanes", "me", 1),  # type: ignore[arg-type]
    )
    mib = 1024 * 1024
    drain.sizes = {1: 100, 2: 3 * mib, 3: 2 * mib, 4: 100, 5: 100, 6: 100}
    assert drain._ahead_of([1, 2, 3, 4, 5, 6]) == [1, 2, 4]  # 3 would pass the 4 MiB
    assert drain._ahead_of([7]) == []  # size unknown: not taken ahead
    assert 4 * mib == lane_runner.AHEAD_MAX_BYTES
