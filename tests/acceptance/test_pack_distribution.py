"""A rule pack of another distribution plugs in without a change to inturn (issue 32, item 4).

The pack (:mod:`tests.support.echo_pack.inturn_echo`) is installed as a distribution would be:
its module beside an ``inturn_echo-0.1.dist-info`` holding its entry point (group
``inturn.packs``), in a folder on the ``PYTHONPATH`` of the processes started here, so the
real ``importlib.metadata`` finds it and nothing of inturn's registry is touched. Then its
``spec.echo`` field is part of the Destination schema (and refused where it is not installed),
its mark hook opens an expectation when ``inturn local``'s worker delivers a message, and its
ingest hook answers it when the echo arrives on its channel (the orders pack's mark hook runs
beside it on the same mark).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from inturn.worker.testing import MllpReceiver
from tests.support.local import INTURN, LocalProcess, free_port, mllp_sender, send

PACK_SOURCE = Path(__file__).resolve().parents[1] / "support" / "echo_pack" / "inturn_echo.py"


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A folder holding the ``inturn-echo`` distribution: its module and its metadata."""
    folder = tmp_path / "site"
    info = folder / "inturn_echo-0.1.dist-info"
    info.mkdir(parents=True)
    shutil.copy(PACK_SOURCE, folder / "inturn_echo.py")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: inturn-echo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[inturn.packs]\necho = inturn_echo:PLUGIN\n")
    return folder


def with_pack(site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "INTURN_DSN"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env


def destination(path: Path, name: str, channel: str, sender: str, extra: str = "") -> Path:
    path.write_text(
        "apiVersion: inturn.dev/v1alpha1\n"
        "kind: Destination\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n"
        f"  channel: {channel}\n"
        f"  sender: {sender}\n"
        "  retry: {maxAttempts: 0, backoffSeconds: 1, maxBackoffSeconds: 1, timeoutSeconds: 5}\n"
        "  idleSeconds: 1\n" + extra
    )
    return path


def test_the_pack_s_field_is_in_the_schema_only_where_it_is_installed(
    site: Path, tmp_path: Path
) -> None:
    good = destination(tmp_path / "good.yaml", "lab", "adt", mllp_sender(2575),
                       "  echo: {replyChannel: echo-back}\n")  # fmt: skip
    bad = destination(tmp_path / "bad.yaml", "lab", "adt", mllp_sender(2575),
                      "  echo: {withinSeconds: 5}\n")  # fmt: skip

    def validate(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(INTURN), "validate", str(path)], env=env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip

    installed = with_pack(site)
    assert validate(good, installed).returncode == 0
    refused = validate(bad, installed)
    assert refused.returncode != 0
    assert "spec.echo.replyChannel: required" in refused.stdout + refused.stderr
    assert "spec.echo.withinSeconds: must be >= 60" in refused.stdout + refused.stderr
    without = validate(good, {k: v for k, v in os.environ.items() if k != "INTURN_DSN"})
    assert without.returncode != 0
    assert "spec.echo: unknown field" in without.stdout + without.stderr
    crd = subprocess.run(
        [sys.executable, "-m", "inturn.worker.spec.schema"], env=installed, capture_output=True,
        text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert crd.returncode == 0 and "Wait for an echo of every message delivered here" in crd.stdout


async def expectation(dsn: str, key: str) -> tuple[str, str, str | None] | None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT destination, reply_channel, answered_control_id"
            "  FROM inturn_order_expectation WHERE order_key = %s",
            (key,),
        )
        row = await cur.fetchone()
    return None if row is None else (row[0], row[1], row[2])


async def until(dsn: str, key: str, want: tuple[str, str, str | None]) -> None:
    async with asyncio.timeout(30):
        while await expectation(dsn, key) != want:
            await asyncio.sleep(0.2)


async def test_its_mark_hook_opens_and_its_ingest_hook_answers(
    site: Path, tmp_path: Path, fresh_db: str
) -> None:
    async with MllpReceiver() as receiver:
        adt, echoes = free_port(), free_port()
        files = [
            destination(tmp_path / "lab.yaml", "lab", "adt", mllp_sender(receiver.port),
                        "  echo: {replyChannel: echo-back}\n"
                        "  replies: [{orderTypes: [ADT^A01], replyTypes: [ORU^R01],"
                        " channel: results, withinSeconds: 3600}]\n"),
            destination(tmp_path / "echoes.yaml", "echoes", "echo-back",
                        mllp_sender(receiver.port)),
        ]  # fmt: skip
        args = [a for f in files for a in ("-f", str(f))]
        local = LocalProcess(
            tmp_path / "local.log",
            [*args, "--listen", f"adt={adt}", "--listen", f"echo-back={echoes}", "--dsn", fresh_db],
            env={"PYTHONPATH": with_pack(site)["PYTHONPATH"]},
        )
        await local.start(adt)
        try:
            order = (
                b"MSH|^~\\&|LAB|NORTH|LIS|NORTH|20260302120000||ADT^A01^ADT_A01|E00001|P|2.5\r"
                b"PID|1||P00001^^^LOCAL^MR||Testperson^One\r"
                b"ORC|NW|K00001\r"
            )
            assert await send(adt, [order]) == ["AA"]
            await until(fresh_db, "E00001", ("default/lab", "echo-back", None))
            # the orders pack's mark hook ran on the same mark (spec.replies, key ORC-2)
            assert await expectation(fresh_db, "K00001") == ("default/lab", "results", None)
            echo = (
                b"MSH|^~\\&|LIS|NORTH|LAB|NORTH|20260302120100||ACK^A01^ACK|R00001|P|2.5\r"
                b"MSA|AA|E00001\r"
            )
            assert await send(echoes, [echo]) == ["AA"]
            await until(fresh_db, "E00001", ("default/lab", "echo-back", "R00001"))
        finally:
            assert await local.interrupt() == 0, local.log()


async def inturn_send(port: int, path: Path) -> tuple[int, str]:
    """``inturn send --mllp 127.0.0.1:PORT FILE``, as the pack page runs it: exit code, output."""
    proc = await asyncio.create_subprocess_exec(
        str(INTURN), "send", "--mllp", f"127.0.0.1:{port}", str(path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def test_the_page_s_example_an_echo_channel_without_destinations_answers(
    site: Path, tmp_path: Path, fresh_db: str
) -> None:
    """docs/howto/write-a-pack.md, "Try it": one Destination with ``spec.echo``, the echo
    channel listened to with ``--accept-unrouted``; the echo closes the expectation and is
    stored nowhere (no ``_unrouted`` queue waits for it)."""
    async with MllpReceiver() as receiver:
        adt, echoes = free_port(), free_port()
        lab = destination(tmp_path / "lab.yaml", "lab", "adt", mllp_sender(receiver.port),
                          "  echo: {replyChannel: echo-back}\n")  # fmt: skip
        (tmp_path / "order.hl7").write_bytes(
            b"MSH|^~\\&|LAB|NORTH|LIS|NORTH|20260302120000||ADT^A01^ADT_A01|E00002|P|2.5\r"
            b"PID|1||P00002^^^LOCAL^MR||Testperson^Two\r"
        )
        (tmp_path / "echo-reply.hl7").write_bytes(
            b"MSH|^~\\&|LIS|NORTH|LAB|NORTH|20260302120100||ACK^A01^ACK|R00002|P|2.5\r"
            b"MSA|AA|E00002\r"
        )
        (tmp_path / "stray.hl7").write_bytes(
            b"MSH|^~\\&|LIS|NORTH|LAB|NORTH|20260302120200||ACK^A01^ACK|R00003|P|2.5\r"
            b"MSA|AA|E09999\r"
        )
        local = LocalProcess(
            tmp_path / "local.log",
            ["-f", str(lab), "--listen", f"adt={adt}", "--listen", f"echo-back={echoes}",
             "--accept-unrouted", "echo-back", "--dsn", fresh_db],
            env={"PYTHONPATH": with_pack(site)["PYTHONPATH"]},
        )  # fmt: skip
        await local.start(adt)
        try:
            code, out = await inturn_send(adt, tmp_path / "order.hl7")
            assert code == 0 and "AA" in out, out
            await until(fresh_db, "E00002", ("default/lab", "echo-back", None))
            code, out = await inturn_send(echoes, tmp_path / "stray.hl7")  # answers nothing
            assert code == 0 and "AA" in out, out
            assert await expectation(fresh_db, "E00002") == ("default/lab", "echo-back", None)
            code, out = await inturn_send(echoes, tmp_path / "echo-reply.hl7")
            assert code == 0 and "AA" in out, out
            assert await expectation(fresh_db, "E00002") == ("default/lab", "echo-back", "R00002")
            async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
                cur = await conn.execute(
                    "SELECT destination, control_id FROM inturn_delivery ORDER BY id"
                )
                assert await cur.fetchall() == [("default/lab", "E00002")]
        finally:
            assert await local.interrupt() == 0, local.log()
