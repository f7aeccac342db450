"""``inturn local`` delivering to an SFTP server: a Destination with ``spec.sender.sftp``, its
Secret's files under ``--secrets-dir``, messages sent by python-hl7's ``mllp_send``, files
read back from the server's directory (a real SFTP server, asyncssh, in this process)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import psycopg

from inturn.operator.manifests import WorkerPodSettings, render
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from tests.support.local import INTURN, LocalProcess, assert_clean, free_port, mllp_send
from tests.support.sftp_server import USER, SftpServer


async def stored_payloads(dsn: str) -> dict[str, bytes]:
    """``{control ID: payload}`` of the queue, in id order."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        # a slim row's payload is its channel log message's (ingest stores a message once)
        cur = await conn.execute(
            "SELECT d.control_id, coalesce(d.payload, m.payload) FROM inturn_delivery d"
            " LEFT JOIN inturn_message m ON m.id = d.message_id ORDER BY d.id"
        )
        return {r[0]: bytes(r[1]) for r in await cur.fetchall()}


def sftp_manifest(path: Path, port: int) -> Path:
    path.write_text(
        "apiVersion: inturn.dev/v1alpha1\n"
        "kind: Destination\n"
        "metadata: {name: to-sftp}\n"
        "spec:\n"
        "  channel: adt\n"
        "  sender:\n"
        "    sftp:\n"
        f"      host: 127.0.0.1\n      port: {port}\n      username: {USER}\n"
        "      secretRef: {name: sftp-partner, privateKeyKey: id_ed25519}\n"
        "      directory: /inbox\n"
        "      fileName: '{controlId}.hl7'\n"
        "      temporaryName: '.{name}.part'\n"
        "  retry: {maxAttempts: 0, backoffSeconds: 1, maxBackoffSeconds: 2, timeoutSeconds: 10}\n"
        "  idleSeconds: 1\n"
    )
    return path


async def test_messages_become_whole_files(
    fresh_db: str, tmp_path: Path, local_runs: list[LocalProcess]
) -> None:
    async with SftpServer(tmp_path) as server:
        listen = free_port()
        manifest = sftp_manifest(tmp_path / "sftp.yaml", server.port)
        local = LocalProcess(
            tmp_path / "local.log",
            [
                "-f",
                str(manifest),
                "--secrets-dir",
                str(server.secrets),
                "--listen",
                f"adt={listen}",
                "--dsn",
                fresh_db,
            ],
        )
        local_runs.append(local)
        await local.start(listen)
        acks = await mllp_send(listen, range(0, 20), tmp_path)
        assert acks == ["AA"] * 20
        names = [f"L{n:05d}.hl7" for n in range(20)]
        async with asyncio.timeout(60):
            while server.files() != names:
                await asyncio.sleep(0.2)
        stored = await stored_payloads(fresh_db)
        assert list(stored) == [f"L{n:05d}" for n in range(20)]  # enqueued in order
        for control_id, payload in stored.items():
            assert (server.inbox / f"{control_id}.hl7").read_bytes() == normalise_terminators(
                payload
            )
        assert await local.interrupt() == 0
        assert_clean(local.log())


async def test_the_operators_rendered_worker_delivers_with_its_mounted_secret(
    fresh_db: str, tmp_path: Path
) -> None:
    """What runs in the cluster: the ConfigMap's worker.json, Secret keys read where the operator
    mounts them (here the mount point is the server's secret directory), ``inturn worker
    --config``."""
    async with SftpServer(tmp_path) as server:
        body = {
            "apiVersion": "inturn.dev/v1alpha1",
            "kind": "Destination",
            "metadata": {"name": "to-sftp", "namespace": "default", "uid": "u", "generation": 1},
            "spec": {
                "channel": "adt",
                "sender": {
                    "sftp": {
                        "host": "127.0.0.1",
                        "port": server.port,
                        "username": USER,
                        "secretRef": {"name": "sftp-partner", "passwordKey": "password"},
                        "directory": "/inbox",
                        "temporaryName": ".{name}.part",
                    }
                },
                "retry": {"maxAttempts": 0, "backoffSeconds": 1, "timeoutSeconds": 10},
                "idleSeconds": 1,
            },
        }
        settings = WorkerPodSettings(image="inturn:test", secrets_dir=str(server.secrets))
        children = render(body, settings)
        mounts = children.deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "secret-0", "mountPath": str(server.secret_dir), "readOnly": True} in mounts
        config = tmp_path / "worker.json"
        config.write_text(children.config_map["data"]["worker.json"])
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            ids = await queue.enqueue(
                conn,
                [NewItem("default/to-sftp", "adt", f"W{n}", "ADT^A01", wmsg(n)) for n in range(3)],
            )
        proc = await asyncio.create_subprocess_exec(
            str(INTURN),
            "worker",
            "--config",
            str(config),
            "--http-port",
            "0",
            env={**os.environ, "INTURN_DSN": fresh_db},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            names = [f"W{n}-{i}.hl7" for n, i in enumerate(ids)]
            async with asyncio.timeout(60):
                while server.files() != names:
                    await asyncio.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode(errors="replace")
        assert (server.inbox / names[2]).read_bytes() == normalise_terminators(wmsg(2))


def wmsg(n: int) -> bytes:
    return f"MSH|^~\\&|A|B|C|D|||ADT^A01|W{n}|P|2.5\rPID|1||{n}\r".encode()
