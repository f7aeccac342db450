"""Timestamps at each hop of a message, for ``bench/latency.py --hops`` (a diagnosis, not a figure).

``bench/latency.py`` sees a message only at its ends (the send, the AA, the receiver's read)
and in between the NOTIFY heard by a listener of its own. With ``--hops`` it starts ingest and
the workers through :func:`run`, which wraps a few of their functions before the command line
starts, so that each process records when its hops happened:

* ingest: each storing transaction (``store_batch``: from the statement's start to its result,
  which comes after the COMMIT), with the MSH-10s it stored;
* a worker (run in ``inturn worker``'s own process, not replaced by ``execv``, so that the
  wrappers stay): each wait for a notification (``StepRunner.wait``) and the moment its connection's
  socket was seen readable (the event loop's reader callback), each head query and each
  delivered mark that returns the next head (with the id found), each MLLP send (from the call
  to the ACK read, with the MSH-10 and the id).

Times are ``time.perf_counter()`` (``CLOCK_MONOTONIC``, one clock for every process of the
machine, as the benchmark's own are). Each process keeps its records in memory and writes them
as JSON lines to ``<directory>/<role>-<pid>.jsonl`` when it exits (SIGTERM included), so that
recording costs a tuple per hop and no system call on the measured path.

The wrappers change nothing of what the functions do; they add about a microsecond per call.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: What this process recorded: (kind, *fields).
RECORDS: list[tuple[Any, ...]] = []
_in_wait = False


def _dump(directory: Path, role: str) -> None:
    path = directory / f"{role}-{os.getpid()}.jsonl"
    with path.open("w") as out:
        for record in RECORDS:
            out.write(json.dumps(record) + "\n")
    RECORDS.clear()


def _install_ingest() -> None:
    from inturn.worker.ingest import batch

    store_batch = batch.store_batch

    @functools.wraps(store_batch)
    async def recorded(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = await store_batch(*args, **kwargs)
        end = time.perf_counter()
        RECORDS.append(("commit", start, end, [m.control_id for m in kwargs["messages"]]))
        return result

    batch.store_batch = recorded  # type: ignore[assignment]


def _install_worker() -> None:
    from asyncio import selector_events

    from inturn.worker.cli import worker as worker_cli

    def stay(_settings: str) -> None:  # run here, with the wrappers, instead of execv
        raise OSError("hops: the worker runs in the process that records its hops")

    worker_cli.exec_runtime = stay  # type: ignore[assignment]

    from inturn.worker.drain import steps
    from inturn.worker.hl7.header import parse_header
    from inturn.worker.senders.mllp import MllpSender
    from inturn.worker.store import delivery

    wait = steps.StepRunner.wait

    @functools.wraps(wait)
    async def recorded_wait(self: Any, *args: Any, **kwargs: Any) -> None:
        global _in_wait
        start = time.perf_counter()
        _in_wait = True
        try:
            await wait(self, *args, **kwargs)
        finally:
            _in_wait = False
            RECORDS.append(("wait", start, time.perf_counter()))

    steps.StepRunner.wait = recorded_wait  # type: ignore[method-assign]

    add_reader = selector_events.BaseSelectorEventLoop.add_reader

    def recorded_add_reader(self: Any, fd: Any, callback: Callable[..., Any], *args: Any) -> Any:
        if not _in_wait:
            return add_reader(self, fd, callback, *args)

        def readable(*a: Any) -> Any:
            RECORDS.append(("readable", time.perf_counter()))
            return callback(*a)

        return add_reader(self, fd, readable, *args)

    selector_events.BaseSelectorEventLoop.add_reader = recorded_add_reader  # type: ignore[method-assign]

    def found(result: Any) -> int | None:
        head = result[0]
        return None if head is None else int(head.item.id)

    next_head = delivery.next_head

    @functools.wraps(next_head)
    async def recorded_head(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = await next_head(*args, **kwargs)
        RECORDS.append(("head", start, time.perf_counter(), found(result)))
        return result

    delivery.next_head = recorded_head

    succeeded_next = delivery.succeeded_next

    @functools.wraps(succeeded_next)
    async def recorded_mark(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = await succeeded_next(*args, **kwargs)
        RECORDS.append(("mark", start, time.perf_counter(), found(result[1])))
        return result

    delivery.succeeded_next = recorded_mark

    send = MllpSender.send

    @functools.wraps(send)
    async def recorded_send(self: Any, payload: bytes, *, item_id: int = 0) -> None:
        start = time.perf_counter()
        try:
            await send(self, payload, item_id=item_id)
        finally:
            cid = parse_header(payload).control_id
            RECORDS.append(("send", start, time.perf_counter(), cid, item_id))

    MllpSender.send = recorded_send  # type: ignore[method-assign]
    _install_statements()


def _install_statements() -> None:
    """Every statement a cursor runs, by its name in ``worker/store/sql`` (``sql``: start,
    end, name)."""
    from importlib import resources

    import psycopg

    from inturn.worker.store import queries

    names: dict[str, str] = {}
    for path in resources.files("inturn.worker.store").joinpath("sql").iterdir():
        if path.name.endswith(".sql"):
            for name, text in queries.load(path.name).items():
                names[text] = f"{path.name[:-4]}.{name}"
    execute = psycopg.AsyncCursor.execute

    @functools.wraps(execute)
    async def recorded(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await execute(self, query, *args, **kwargs)
        finally:
            name = names.get(query) if isinstance(query, str) else None
            RECORDS.append(("sql", start, time.perf_counter(), name or str(query)[:40]))

    psycopg.AsyncCursor.execute = recorded  # type: ignore[method-assign]


def install(role: str, directory: str) -> None:
    """Wrap the functions of ``role`` (``ingest`` or ``worker``) and write the records to
    ``directory`` at exit."""
    where = Path(directory)
    if role == "ingest":
        _install_ingest()
    elif role == "worker":
        _install_worker()
    else:
        raise ValueError(f"no hops for {role!r}")
    atexit.register(_dump, where, role)

    def on_term(_signum: int, _frame: Any) -> None:  # only if the command sets no handler
        _dump(where, role)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)


def command(role: str, directory: Path, argv: list[str]) -> list[str]:
    """The command line that runs ``inturn ingest <argv>`` (``role`` ``ingest``) or
    ``inturn worker <argv>`` with the hops of ``role`` recorded in ``directory``."""
    here = str(Path(__file__).resolve().parent)
    run = (
        "from inturn.worker.cli.ingest import ingest_command as c; c()"
        if role == "ingest"
        else "from inturn.worker.entry import main as c; sys.exit(c())"
    )
    words = ["inturn", *(["worker"] if role == "worker" else []), *argv]
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import hops;"
        f" hops.install({role!r}, {str(directory)!r}); sys.argv = {words!r}; {run}"
    )
    return [sys.executable, "-c", code]


def load(directory: Path) -> dict[str, list[list[Any]]]:
    """Every record written to ``directory``, by kind (each worker's in one list per process:
    ``worker-<pid>`` keys hold that process's records in order)."""
    out: dict[str, list[list[Any]]] = {}
    for path in sorted(directory.glob("*-*.jsonl")):
        out[path.stem] = [json.loads(line) for line in path.read_text().splitlines()]
    return out


def _found(records: list[list[Any]]) -> tuple[dict[int, dict[str, Any]], dict[str, list[Any]]]:
    """One worker's records: how each id was found (by a head query after a wait, ``woken``;
    by one without a wait since the last, ``looked``; returned by the previous delivered mark,
    ``prefetched``) and each MSH-10's send."""
    found: dict[int, dict[str, Any]] = {}
    sends: dict[str, list[Any]] = {}
    waited: list[Any] | None = None
    readable: float | None = None
    for record in records:
        kind = record[0]
        if kind == "readable":
            readable = record[1] if readable is None else readable  # the first
        elif kind == "wait":
            waited = [record[1], record[2], readable]
            readable = None
        elif kind in ("head", "mark"):
            _, start, end, item = record
            if item is not None and item not in found:
                how = "prefetched" if kind == "mark" else "woken" if waited else "looked"
                found[item] = {"how": how, "start": start, "end": end, "wait": waited}
            waited = None
        elif kind == "send":
            sends.setdefault(record[3], [record[1], record[2], record[4]])
    return found, sends


#: The hops of one message, in order, as :func:`breakdown` names them.
HOPS = (
    ("commit_aa", "ingest's COMMIT -> AA read by the sender"),
    ("commit_found", "COMMIT -> the worker's statement returns the row"),
    ("found_send", "-> the worker starts the send"),
    ("send_read", "-> the receiver reads it"),
)
#: The parts of ``commit_found`` for a message found by a head query after a wait.
WOKEN = (
    ("commit_readable", "COMMIT -> the worker's socket seen readable (NOTIFY)"),
    ("readable_head", "-> its head query starts"),
    ("head", "the head query (lease renewal and COMMIT)"),
)
#: The parts of ``commit_found`` for a message the previous one's delivered mark returned.
PREFETCHED = (
    ("commit_mark", "COMMIT -> the previous message's mark starts (its send, its ACK)"),
    ("mark", "that mark (the delivered row, the next head, the COMMIT)"),
)
#: The worker's time for one message: the whole MLLP exchange.
EXCHANGE = (("send_ack", "the send to its ACK read by the worker"),)


def breakdown(
    records: dict[str, list[list[Any]]],
    latencies: dict[str, float],
    acked: dict[str, float],
    arrived: dict[str, float],
) -> dict[str, Any]:
    """Where the time of the messages in ``latencies`` (AA -> receiver, ms, by MSH-10) went,
    from ``records`` (:func:`load`): for all of them (p50) and for the slowest 1% (mean), each
    hop in ms and how their rows were found (``woken``, ``looked``, ``prefetched`` counts)."""
    commits: dict[str, float] = {}
    for name, rows in records.items():
        if name.startswith("ingest-"):
            for _, _, end, cids in rows:
                for cid in cids:
                    commits.setdefault(cid, end)
    found: dict[str, dict[str, Any]] = {}
    for name, rows in records.items():
        if name.startswith("worker-"):
            by_id, sends = _found(rows)
            for cid, (start, _end, item) in sends.items():
                if item in by_id:
                    found[cid] = {**by_id[item], "send": start, "acked": _end}
    hops: dict[str, dict[str, float]] = {}
    for cid in latencies:
        commit, how = commits.get(cid), found.get(cid)
        if commit is None or how is None or cid not in arrived:
            continue
        h = {
            "latency": latencies[cid],
            "commit_aa": (acked[cid] - commit) * 1000,
            "commit_found": (how["end"] - commit) * 1000,
            "found_send": (how["send"] - how["end"]) * 1000,
            "send_read": (arrived[cid] - how["send"]) * 1000,
            "send_ack": (how["acked"] - how["send"]) * 1000,
            "how": how["how"],
        }
        wait = how["wait"]
        if how["how"] == "woken" and wait is not None and wait[2] is not None:
            h["commit_readable"] = (wait[2] - commit) * 1000
            h["readable_head"] = (how["start"] - wait[2]) * 1000
            h["head"] = (how["end"] - how["start"]) * 1000
        elif how["how"] == "prefetched":
            h["commit_mark"] = (how["start"] - commit) * 1000
            h["mark"] = (how["end"] - how["start"]) * 1000
        hops[cid] = h  # type: ignore[assignment]
    ordered = sorted(hops.values(), key=lambda h: h["latency"])
    tail = ordered[int(len(ordered) * 0.99) :]

    def summary(group: list[dict[str, Any]], middle: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"messages": len(group)}
        for key, _ in (("latency", ""), *HOPS, *WOKEN, *PREFETCHED, *EXCHANGE):
            values = sorted(h[key] for h in group if key in h)
            if not values:
                out[key] = None
            elif middle:
                out[key] = round(values[len(values) // 2], 2)
            else:
                out[key] = round(sum(values) / len(values), 2)
        for how in ("woken", "looked", "prefetched"):
            out[how] = sum(1 for h in group if h["how"] == how)
        return out

    counts = {"sends": 0, "heads": 0, "empty_heads": 0, "marks": 0, "waits": 0}
    for name, rows in records.items():
        if name.startswith("worker-"):
            for row in rows:
                kind = row[0]
                if kind == "send":
                    counts["sends"] += 1
                elif kind == "head":
                    counts["heads"] += 1
                    counts["empty_heads"] += row[3] is None
                elif kind in ("mark", "wait"):
                    counts[kind + "s"] += 1
    return {
        "all_p50": summary(ordered, True),
        "slowest_1pct_mean": summary(tail, False),
        "statements": counts,  # every worker statement of the run, warm-up included
    }


def schedstat(pids: list[int]) -> tuple[int, int, int]:
    """CPU time (ns), time waiting on a run queue (ns) and timeslices, summed over every thread
    of ``pids`` (``/proc/<pid>/task/<tid>/schedstat``); a process gone counts nothing."""
    run = wait = slices = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
            except OSError:
                continue
            run, wait, slices = run + int(fields[0]), wait + int(fields[1]), slices + int(fields[2])
    return run, wait, slices


def cpu_pressure_us() -> int | None:
    """The machine's CPU pressure so far: microseconds in which at least one runnable task
    waited for a CPU (``/proc/pressure/cpu``, ``some total``); None without PSI."""
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return None
    return int(first.rsplit("total=", 1)[1])


Snapshot = dict[str, tuple[int, int, int]]


def snapshot(groups: dict[str, list[int]]) -> Snapshot:
    """:func:`schedstat` of each group of processes, and the machine's CPU pressure under
    ``"machine"`` (its microseconds as the first field)."""
    out = {name: schedstat(pids) for name, pids in groups.items()}
    out["machine"] = (cpu_pressure_us() or 0, 0, 0)
    return out


def scheduling(before: Snapshot, after: Snapshot, seconds: float) -> dict[str, Any]:
    """Between two snapshots ``seconds`` apart: each group's CPU (% of one core), its time on a
    run queue (ms per second: how long its threads were runnable but not running) and the mean
    wait per timeslice (µs); ``pressure_pct``: the share of the time some task of the machine
    waited for a CPU."""
    out: dict[str, Any] = {}
    for name, (run, wait, slices) in after.items():
        if name == "machine":
            continue
        r0, w0, s0 = before.get(name, (0, 0, 0))
        d_run, d_wait, d_slices = run - r0, wait - w0, max(slices - s0, 1)
        out[name] = {
            "cpu_pct": round(d_run / seconds / 1e7, 1),
            "runqueue_ms_per_s": round(d_wait / seconds / 1e6, 1),
            "wait_per_slice_us": round(d_wait / d_slices / 1e3, 1),
        }
    pressure = after["machine"][0] - before["machine"][0]
    out["pressure_pct"] = round(pressure / seconds / 1e4, 1)
    return out
