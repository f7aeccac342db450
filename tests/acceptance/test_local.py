"""``inturn local`` as a user runs it: a subprocess, real sockets, messages sent by python-hl7's
``mllp_send`` (an MLLP client none of us wrote), real receivers that go down and come back.

Each test starts its own ``inturn local`` on the session database (``--dsn``), except the last,
which lets it start its embedded Postgres. Manifests are written into ``tmp_path``; every port is
a free one. Every run ends with Ctrl-C (SIGINT) and must exit 0.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import socket
import sys
import urllib.error
import urllib.request
from asyncio.subprocess import PIPE
from pathlib import Path
from typing import Any

import psycopg
import pytest

from inturn.worker.hl7.header import parse_header
from inturn.worker.store import queue
from inturn.worker.store.dsn import LOCAL_DISCOVERY_ENV
from inturn.worker.store.model import NewItem
from inturn.worker.testing import HttpReceiver, MllpReceiver
from tests.support.local import (
    HOST,
    INTURN,
    LocalProcess,
    assert_clean,
    free_port,
    http_sender,
    manifest,
    message,
    mllp_send,
    mllp_sender,
    send,
)
from tests.support.pipeline import until

BIN = Path(sys.executable).parent


def ids(received: list[bytes]) -> list[str]:
    return [parse_header(p).control_id for p in received]


def expected(numbers: range) -> list[str]:
    return [f"L{n:05d}" for n in numbers]


def without_repeats(values: list[str]) -> list[str]:
    """``values`` with each run of one repeated value kept once."""
    return [v for i, v in enumerate(values) if i == 0 or values[i - 1] != v]


wait_until = functools.partial(until, timeout=30, every=0.2)


async def count(dsn: str, sql: str, *params: Any) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def pending(dsn: str) -> int:
    """Messages waiting, every destination together, as `inturn queue depth` counts them: the
    queues' pending rows and the channel log's messages a destination has not pulled yet."""
    from psycopg import AsyncConnection

    from inturn.worker.store import reads

    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        return sum(row.pending for row in await reads.depth(conn))


async def test_outage_every_message_once_and_in_order(
    fresh_db: str, tmp_path: Path, local_runs: list[LocalProcess]
) -> None:
    """Two destinations on one channel; the MLLP receiver is down for the middle third."""
    async with MllpReceiver() as mllp, HttpReceiver() as http:
        port = free_port()
        manifests = [
            manifest(tmp_path / "mllp.yaml", "to-mllp", mllp_sender(mllp.port), max_backoff=2),
            manifest(
                tmp_path / "http.yaml", "to-http", http_sender(f"{http.url}hl7"), max_backoff=2
            ),
        ]
        args = [a for m in manifests for a in ("-f", str(m))]
        local = LocalProcess(
            tmp_path / "local.log", [*args, "--listen", f"adt={port}", "--dsn", fresh_db]
        )
        local_runs.append(local)
        await local.start(port)

        acks = await mllp_send(port, range(0, 100), tmp_path)
        await mllp.wait_for(100, timeout=30)
        await mllp.stop()  # down
        acks += await mllp_send(port, range(100, 200), tmp_path)
        await wait_until(lambda: pending_is(fresh_db, 100))  # HTTP has them all; MLLP waits
        assert len(http.received) == 200
        assert len(mllp.received) in (100, 101)  # perhaps the one in flight when it went down
        await mllp.start()  # back
        acks += await mllp_send(port, range(200, 300), tmp_path)
        await wait_until(lambda: pending_is(fresh_db, 0), timeout=60)
        code = await local.interrupt()

    assert acks == ["AA"] * 300
    assert ids(http.received) == expected(range(300))  # exactly once, in order
    got = ids(mllp.received)
    assert without_repeats(got) == expected(range(300))  # every one, in order
    assert len(got) <= 301  # at most one sent twice: the one in flight at the outage
    assert code == 0
    assert_clean(local.log())
    # the recovery is logged as the failures were
    assert "destination default/to-mllp: delivering again after " in local.log()


async def pending_is(dsn: str, n: int) -> bool:
    return await pending(dsn) == n


async def test_manifest_changes_apply_without_restart(
    fresh_db: str, tmp_path: Path, local_runs: list[LocalProcess]
) -> None:
    """Suspend, remove (messages kept, worker gone), restore on another port, bad edit ignored."""
    watched = tmp_path / "manifests"
    watched.mkdir()
    path = watched / "dest.yaml"
    # the worker's own database connection (it holds the destination's lock)
    worker_connections = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
    app = "inturn-worker default/moving"
    async with MllpReceiver() as first, MllpReceiver() as second:
        port = free_port()
        manifest(path, "moving", mllp_sender(first.port), max_backoff=2)
        local = LocalProcess(
            tmp_path / "local.log",
            ["-f", str(watched), "--listen", f"adt={port}", "--dsn", fresh_db],
            env={"INTURN_REMOVAL_GRACE_SECONDS": "1"},
        )
        local_runs.append(local)
        await local.start(port)
        assert await mllp_send(port, range(0, 5), tmp_path) == ["AA"] * 5
        await first.wait_for(5)
        assert await count(fresh_db, worker_connections, app) == 1

        # suspend: true -> messages are accepted and kept, nothing is sent
        manifest(path, "moving", mllp_sender(first.port), max_backoff=2, suspend=True)
        await local.wait_log("default/moving changed: worker restarted")
        assert await mllp_send(port, range(5, 10), tmp_path) == ["AA"] * 5
        await asyncio.sleep(3)
        assert len(first.received) == 5
        assert await pending(fresh_db) == 5

        # file removed -> worker stopped, its messages kept
        path.unlink()
        await local.wait_log("default/moving: its manifest is gone; removed in 1 s unless")
        await local.wait_log("default/moving removed: its worker stopped")
        await local.wait_log("default/moving: no longer routed, 5 pending kept")
        await wait_until(lambda: count_is(fresh_db, 0, worker_connections, app))
        assert await pending(fresh_db) == 5

        # file back, unsuspended, pointing at another receiver -> the kept messages go there
        manifest(path, "moving", mllp_sender(second.port), max_backoff=2)
        await second.wait_for(5, timeout=30)
        assert ids(second.received) == expected(range(5, 10))
        assert len(first.received) == 5

        # an invalid edit is reported and the last good configuration keeps running
        path.write_text(path.read_text().replace("maxAttempts: 0", "maxAttempts: -1"))
        await local.wait_log("manifests not applied")
        assert await mllp_send(port, range(10, 15), tmp_path) == ["AA"] * 5
        await second.wait_for(10, timeout=30)
        assert ids(second.received) == expected(range(5, 15))
        manifest(path, "moving", mllp_sender(second.port), max_backoff=2)  # fixed: said so
        await local.wait_log("manifests valid again")
        code = await local.interrupt()
    assert code == 0
    assert_clean(local.log())


async def count_is(dsn: str, n: int, sql: str, *params: Any) -> bool:
    return await count(dsn, sql, *params) == n


async def test_ctrl_c_mid_delivery_exits_zero_and_loses_nothing(
    fresh_db: str, tmp_path: Path, local_runs: list[LocalProcess]
) -> None:
    async with MllpReceiver() as rx:
        rx.delay_seconds = 1.0  # an attempt is in flight when Ctrl-C comes
        port = free_port()
        path = manifest(tmp_path / "slow.yaml", "slow", mllp_sender(rx.port), max_backoff=2)
        local = LocalProcess(
            tmp_path / "local.log", ["-f", str(path), "--listen", f"adt={port}", "--dsn", fresh_db]
        )
        local_runs.append(local)
        await local.start(port)
        assert await mllp_send(port, range(0, 10), tmp_path) == ["AA"] * 10
        await rx.wait_for(2, timeout=30)
        code = await local.interrupt()
        with pytest.raises(OSError):  # the listener is gone
            await asyncio.open_connection(HOST, port)
    log = local.log()
    assert code == 0, log
    assert "stopping: listeners first, then workers" in log
    assert_clean(log)
    delivered = await count(
        fresh_db, "SELECT count(*) FROM inturn_delivery WHERE state = 'delivered'"
    )
    assert delivered + await pending(fresh_db) == 10
    assert 1 <= delivered <= len(rx.received)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (("port: 2576", "port: 99999"), "spec.sender.mllp.port"),
        (("  channel: adt\n", ""), "spec.channel"),
        (("maxAttempts: 0", "maxAttempts: -1"), "spec.retry.maxAttempts"),
        (("suspend: false", "suspend: false\n  colour: blue"), "spec.colour"),
    ],
)
async def test_bad_manifest_one_line_naming_the_field_exit_2(
    tmp_path: Path, edit: tuple[str, str], field: str
) -> None:
    path = manifest(tmp_path / "bad.yaml", "bad", mllp_sender(2576), max_backoff=2)
    path.write_text(path.read_text().replace(*edit))
    proc = await asyncio.create_subprocess_exec(
        str(INTURN),
        "local",
        "-f",
        str(path),
        "--listen",
        f"adt={free_port()}",
        "--data-dir",
        str(tmp_path / "never-created"),
        env={k: v for k, v in os.environ.items() if k != "INTURN_DSN"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2
    assert out == b""
    assert len(lines) == 1 and "bad.yaml" in lines[0] and field in lines[0], lines
    assert not (tmp_path / "never-created").exists()  # nothing was started


async def test_embedded_postgres_keeps_the_backlog_across_restarts(
    tmp_path: Path, local_runs: list[LocalProcess], pg_home: Path
) -> None:
    """No --dsn: the embedded Postgres under --data-dir holds what was accepted while the
    receiver was down, and a restarted ``inturn local`` delivers it."""
    data = pg_home / "d"  # short: the server's Unix socket lives under it
    rx = MllpReceiver(port=free_port())  # down for now
    port = free_port()
    path = manifest(tmp_path / "dest.yaml", "later", mllp_sender(rx.port), max_backoff=2)
    args = ["-f", str(path), "--listen", f"adt={port}", "--data-dir", str(data)]

    first = LocalProcess(tmp_path / "local.log", args)
    local_runs.append(first)
    await first.start(port)
    assert await mllp_send(port, range(0, 20), tmp_path) == ["AA"] * 20
    assert await first.interrupt() == 0
    assert "embedded Postgres stopped" in first.log()
    assert not (data / "pg" / "postmaster.pid").exists()

    second = LocalProcess(tmp_path / "local.log", args)
    local_runs.append(second)
    async with rx:
        await second.start(port)
        await rx.wait_for(20, timeout=60)
        assert await mllp_send(port, range(20, 25), tmp_path) == ["AA"] * 5
        await rx.wait_for(25, timeout=30)
        assert await second.interrupt() == 0
    assert without_repeats(ids(rx.received)) == expected(range(25))
    assert len(rx.received) == 25
    assert_clean(second.log())


async def run_inturn(*args: str, cwd: Path) -> tuple[int, str, str]:
    """Run ``inturn ARGS`` in ``cwd`` (a test's own folder) as a user would: no ``INTURN_DSN``,
    ``./.inturn`` discovery on."""
    env = {k: v for k, v in os.environ.items() if k != "INTURN_DSN"}
    env[LOCAL_DISCOVERY_ENV] = "on"
    proc = await asyncio.create_subprocess_exec(
        str(INTURN), *args, cwd=cwd, env=env, stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_one_local_per_data_dir_queue_finds_it_and_sighup_stops_postgres(
    tmp_path: Path, local_runs: list[LocalProcess], pg_home: Path
) -> None:
    """In a folder where ``inturn local`` runs on its default ./.inturn: a second one is refused
    naming the first one's pid, ``inturn queue`` needs no --dsn, and closing the terminal
    (SIGHUP) stops both inturn local and its embedded Postgres."""
    port = free_port()
    path = manifest(tmp_path / "dest.yaml", "here", mllp_sender(free_port()), max_backoff=2)
    first = LocalProcess(
        tmp_path / "local.log", ["-f", str(path), "--listen", f"adt={port}"], cwd=pg_home
    )
    local_runs.append(first)
    await first.start(port)
    assert first.proc is not None
    assert await mllp_send(port, range(0, 3), tmp_path) == ["AA"] * 3

    code, out, err = await run_inturn(
        "local", "-f", str(path), "--listen", f"adt={free_port()}", cwd=pg_home
    )
    assert code == 2 and out == ""
    assert err == (
        "inturn: error: .inturn is in use by another inturn local"
        f" (pid {first.proc.pid}): stop it, or give this one a --data-dir of its own\n"
    )

    code, out, err = await run_inturn("queue", "depth", "--json", cwd=pg_home)
    assert code == 0, err
    assert [(d["destination"], d["pending"]) for d in json.loads(out)] == [("default/here", 3)]

    first.proc.send_signal(signal.SIGHUP)
    async with asyncio.timeout(30):
        assert await first.proc.wait() == 0
    assert "embedded Postgres stopped" in first.log()
    assert not (pg_home / ".inturn" / "pg" / "postmaster.pid").exists()
    code, out, err = await run_inturn("queue", "depth", cwd=pg_home)
    assert code == 2
    assert "./.inturn holds an embedded Postgres that is not running" in err


async def test_warns_of_no_manifest_and_of_a_channel_without_listener(
    tmp_path: Path, fresh_db: str, local_runs: list[LocalProcess]
) -> None:
    empty = tmp_path / "none"
    empty.mkdir()
    port = free_port()
    local = LocalProcess(
        tmp_path / "local.log", ["-f", str(empty), "--listen", f"adt={port}", "--dsn", fresh_db]
    )
    local_runs.append(local)
    await local.start(port)
    await local.wait_log(f"no Destination manifest found in {empty}: nothing will be delivered")
    # a manifest on channel "lab", which nothing listens to
    (empty / "lab.yaml").write_text(
        manifest(tmp_path / "x.yaml", "lab-dest", mllp_sender(free_port()), max_backoff=2)
        .read_text()
        .replace("channel: adt", "channel: lab")
    )
    await local.wait_log(
        "destination default/lab-dest takes channel lab, which has no --listen: only HTTP"
        " ingest can feed it"
    )
    assert await local.interrupt() == 0
    assert_clean(local.log())


async def test_ctrl_c_says_what_it_waits_for_and_a_second_abandons(
    tmp_path: Path, fresh_db: str, local_runs: list[LocalProcess]
) -> None:
    async with MllpReceiver() as rx:
        rx.reply = False  # the attempt stays in flight until its 120 s timeout
        port = free_port()
        path = manifest(tmp_path / "slow.yaml", "slow", mllp_sender(rx.port), max_backoff=2)
        path.write_text(path.read_text().replace("timeoutSeconds: 5", "timeoutSeconds: 120"))
        local = LocalProcess(
            tmp_path / "local.log", ["-f", str(path), "--listen", f"adt={port}", "--dsn", fresh_db]
        )
        local_runs.append(local)
        await local.start(port)
        assert await mllp_send(port, range(0, 1), tmp_path) == ["AA"]
        await rx.wait_for(1, timeout=30)
        assert local.proc is not None
        local.proc.send_signal(signal.SIGINT)
        await local.wait_log(
            "destination default/slow: waiting up to 120s for the answer to the attempt in"
            " flight; Ctrl-C again abandons it (the message stays pending)"
        )
        assert local.proc.returncode is None  # still waiting
        code = await local.interrupt()  # the second Ctrl-C
    assert code == 0
    assert "abandoning the attempts in flight; their messages stay pending" in local.log()
    assert await pending(fresh_db) == 1
    assert_clean(local.log())


async def test_console_beside_the_local_run(
    fresh_db: str, tmp_path: Path, local_runs: list[LocalProcess]
) -> None:
    """``--console PORT``: the console serves the local run; without an auth file every local
    caller is ``<user>@local`` with every role, and the log says the console is open."""
    import aiohttp

    async with MllpReceiver() as mllp:
        port, console = free_port(), free_port()
        m = manifest(tmp_path / "m.yaml", "to-mllp", mllp_sender(mllp.port), max_backoff=2)
        local = LocalProcess(
            tmp_path / "local.log",
            ["-f", str(m), "--listen", f"adt={port}", "--dsn", fresh_db, "--console", str(console)],
        )
        local_runs.append(local)
        await local.start(port)
        await mllp_send(port, range(0, 3), tmp_path)
        await mllp.wait_for(3)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{HOST}:{console}/api/v1/me") as r:
                me = await r.json()
            assert me["name"].endswith("@local") and me["roles"] == [
                "operator",
                "privacy",
                "viewer",
            ]
            rows: list[dict[str, Any]] = []

            async def listed() -> bool:  # the overview is refreshed every two seconds
                nonlocal rows
                async with session.get(f"http://{HOST}:{console}/api/v1/overview") as r:
                    rows = (await r.json())["destinations"]
                return bool(rows)

            await wait_until(listed)
        assert [(row["destination"], row["sender"]) for row in rows] == [
            ("default/to-mllp", f"mllp://{HOST}:{mllp.port}")
        ]
        assert "console: OPEN to every local user" in local.log()
        assert await local.interrupt() == 0
        assert_clean(local.log())


@pytest.mark.parametrize("flag", ["--listen", "--http", "--console"])
async def test_a_busy_port_names_its_flag_and_no_worker_starts(
    tmp_path: Path, fresh_db: str, flag: str
) -> None:
    """Issue 28, item 4: every listener binds before any worker starts, and a port another
    program holds stops ``inturn local`` in one line naming the option (exit 2), before a
    waiting message was sent."""
    async with MllpReceiver() as rx:
        path = manifest(tmp_path / "dest.yaml", "busy", mllp_sender(rx.port))
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            await queue.enqueue(conn, [NewItem("default/busy", "adt", "B1", "ADT^A01", message(1))])
        with socket.socket() as taken:
            taken.bind((HOST, 0))
            taken.listen()
            busy = taken.getsockname()[1]
            ports = {"--listen": f"adt={HOST}:{free_port()}", "--http": f"{HOST}:{free_port()}"}
            ports[flag] = f"adt={HOST}:{busy}" if flag == "--listen" else f"{HOST}:{busy}"
            args = ["--listen", ports["--listen"], "--http", ports["--http"]]
            if flag == "--console":
                args += ["--console", f"{HOST}:{busy}"]
            proc = await asyncio.create_subprocess_exec(
                str(INTURN), "local", "-f", str(path), "--dsn", fresh_db, *args,
                env={k: v for k, v in os.environ.items() if k != "INTURN_DSN"},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                cwd=path.parent,
            )  # fmt: skip
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 2 and out == b"", err.decode()
        assert err.decode().splitlines()[-1] == (
            f"inturn: error: {flag} {ports[flag]} is in use (another program listens there):"
            " stop it, or choose another port"
        )
        assert "lease held" not in err.decode()  # no worker started
        await asyncio.sleep(1)
        assert rx.received == []


def postmaster_pid(data: Path) -> int:
    return int((data / "pg" / "postmaster.pid").read_text().split("\n", 1)[0])


async def test_a_killed_embedded_postgres_is_restarted_and_nothing_is_lost(
    tmp_path: Path, local_runs: list[LocalProcess], pg_home: Path
) -> None:
    """Issue 28, item 4: SIGKILL to the embedded Postgres; inturn local starts it again (logged,
    bounded tries) and goes on: what was accepted before and after is delivered, in order."""
    data = pg_home / "d"
    port = free_port()
    async with MllpReceiver() as rx:
        path = manifest(tmp_path / "dest.yaml", "kept", mllp_sender(rx.port), max_backoff=1)
        run = LocalProcess(
            tmp_path / "local.log",
            ["-f", str(path), "--listen", f"adt={port}", "--data-dir", str(data)],
        )
        local_runs.append(run)
        await run.start(port)
        assert await mllp_send(port, range(0, 5), tmp_path) == ["AA"] * 5
        await rx.wait_for(5, timeout=30)
        killed = postmaster_pid(data)
        os.kill(killed, signal.SIGKILL)
        await run.wait_log("embedded Postgres restarted (try 1 of 3)", timeout=60)
        assert "is not running (killed or crashed)" in run.log()
        assert postmaster_pid(data) != killed
        async with asyncio.timeout(60):  # ingest's pool reconnects: AA again
            while (await mllp_send(port, range(5, 6), tmp_path)) != ["AA"]:
                await asyncio.sleep(0.5)
        assert await mllp_send(port, range(6, 10), tmp_path) == ["AA"] * 4
        await rx.wait_for(10, timeout=60)
        assert await run.interrupt() == 0
    assert without_repeats(ids(rx.received))[-5:] == expected(range(5, 10))
    assert without_repeats(ids(rx.received))[:5] == expected(range(5))


async def test_an_embedded_postgres_that_cannot_come_back_stops_inturn_local_non_zero(
    tmp_path: Path, local_runs: list[LocalProcess], pg_home: Path
) -> None:
    """Its data directory damaged after a kill: three tries, each logged, then inturn local
    stops (listeners, workers) and exits 1 with one line, for a supervisor to act on."""
    data = pg_home / "d"
    port = free_port()
    path = manifest(tmp_path / "dest.yaml", "gone", mllp_sender(free_port()))
    run = LocalProcess(
        tmp_path / "local.log",
        ["-f", str(path), "--listen", f"adt={port}", "--data-dir", str(data)],
    )
    local_runs.append(run)
    await run.start(port)
    (data / "pg" / "PG_VERSION").write_text("7\n")  # a server of another major version's
    os.kill(postmaster_pid(data), signal.SIGKILL)
    assert run.proc is not None
    async with asyncio.timeout(90):
        code = await run.proc.wait()
    log = run.log()
    assert code == 1
    assert [n for n in (1, 2, 3) if f"embedded Postgres restart {n} of 3 failed" in log] == [
        1,
        2,
        3,
    ]
    last = log.strip().splitlines()[-1]
    assert last.startswith("inturn: error: the embedded Postgres could not be restarted (3 tries):")
    assert "stopping: listeners first, then workers" in log


WINDOW_1S = ("--duplicate-delivered-window", "1")


async def test_ingests_settings_are_inturn_ingests_duplicate_delivered_window(
    tmp_path: Path, fresh_db: str, local_runs: list[LocalProcess]
) -> None:
    """``--duplicate-delivered-window`` reaches local's ingest (the shared option group): with
    a 1 s lost-ACK window, a copy of a message delivered 30 s ago is queued again as a re-send
    (linked to it), where the default 10 minutes would answer it as a duplicate."""
    path = manifest(tmp_path / "held.yaml", "held", mllp_sender(free_port()), suspend=True)
    port = free_port()
    local = LocalProcess(
        tmp_path / "local.log",
        ["-f", str(path), "--listen", f"adt={port}", "--dsn", fresh_db, *WINDOW_1S],
    )
    local_runs.append(local)
    await local.start(port)
    assert await send(port, [message(1, "W")]) == ["AA"]
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        # the suspended destination's worker pulls nothing: pull its row out of the channel
        # log as a person's action does, then play its delivery 30 s ago
        await conn.execute("SELECT * FROM inturn_pull_for('default/held', 100)")
        await conn.execute(
            "UPDATE inturn_delivery SET state = 'delivered', finished_at = now() - interval '30s'"
        )
    assert await send(port, [message(1, "W")]) == ["AA"]
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute("SELECT * FROM inturn_pull_for('default/held', 100)")
        cur = await conn.execute("SELECT id, state, resent_from FROM inturn_delivery ORDER BY id")
        rows = await cur.fetchall()
    first = rows[0][0]
    assert rows == [(first, "delivered", None), (first + 1, "pending", first)]
    assert await local.interrupt() == 0
    assert_clean(local.log())


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_ops_says_the_lanes_as_a_worker_s_http_port_does(
    tmp_path: Path, fresh_db: str, local_runs: list[LocalProcess]
) -> None:
    """docs/howto/lanes.md: ``GET /lanes`` on ``--ops`` under ``inturn local``, one line per
    destination with lanes (none for the one without)."""
    laned = manifest(tmp_path / "laned.yaml", "laned", mllp_sender(free_port()))
    laned.write_text(laned.read_text() + "  lanes: {count: 2}\n")
    manifest(tmp_path / "single.yaml", "single", mllp_sender(free_port()))
    port, ops = free_port(), free_port()
    local = LocalProcess(
        tmp_path / "local.log",
        ["-f", str(tmp_path), "--listen", f"adt={port}", "--ops", f"{HOST}:{ops}",
         "--dsn", fresh_db],
    )  # fmt: skip
    local_runs.append(local)
    await local.start(port)
    url = f"http://{HOST}:{ops}/lanes"

    async def answered() -> bool:
        return (await asyncio.to_thread(get, url))[1].startswith("default/laned: ")

    await wait_until(answered)
    status, body = await asyncio.to_thread(get, url)
    assert status == 200
    assert body == "default/laned: 0 of 2 lanes sending\n"
    assert await local.interrupt() == 0
