"""The SFTP sender against a real SFTP server (asyncssh, in this process), alone and drained by
a worker; its kind's schema, rendering and Secret mounts."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from psycopg import AsyncConnection

from inturn.operator.manifests import WorkerPodSettings, render, sender_summary
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.senders.base import DeliveryError
from inturn.worker.senders.sftp import SftpSender, SftpSenderConfig, file_name
from inturn.worker.spec.destination import ManifestError, load_manifest
from inturn.worker.store import queue, reads
from inturn.worker.store.model import NewItem
from tests.support.pipeline import FAST_RETRY, worker, worker_config
from tests.support.sftp_server import USER, SftpServer

DEST = "hospital/billing-drop"


def message(n: int, control_id: str | None = None) -> bytes:
    cid = control_id or f"MSG{n:05d}"
    return (
        f"MSH|^~\\&|ADT|HOSP|BILL|HOSP|20261130120000||ADT^A03|{cid}|P|2.5\r"
        f"PID|1||P{n}^^^HOSP^MR||DOE^JANE\r"
    ).encode()


def config(server: SftpServer, **changes: Any) -> SftpSenderConfig:
    secret = server.secret_dir
    values: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": server.port,
        "username": USER,
        "known_hosts_file": str(secret / "known_hosts"),
        "private_key_file": str(secret / "id_ed25519"),
        "directory": "/inbox",
        "temporary_name": ".{name}.part",
        "timeout_seconds": 10,
    }
    values.update(changes)
    return SftpSenderConfig(**values)


@pytest.mark.parametrize(
    ("pattern", "control_id", "item_id", "name"),
    [
        ("{controlId}-{id}.hl7", "MSG1", 7, "MSG1-7.hl7"),
        ("{controlId}.hl7", "../etc/passwd", 1, "_._etc_passwd.hl7"),
        ("{id}.txt", "", 12, "12.txt"),
        ("x-{controlId}", "a b/c", 1, "x-a_b_c"),
    ],
)
def test_file_names_fill_the_pattern_with_safe_characters(
    pattern: str, control_id: str, item_id: int, name: str
) -> None:
    assert file_name(pattern, control_id, item_id) == name


def test_a_pattern_naming_the_control_id_needs_one() -> None:
    with pytest.raises(ValueError):
        file_name("{controlId}.hl7", "", 1)


async def test_a_message_becomes_one_whole_file_written_then_renamed(tmp_path: Path) -> None:
    async with SftpServer(tmp_path) as server:
        sender = SftpSender(config(server))
        try:
            await sender.send(message(1), item_id=41)
            await sender.send(message(2), item_id=42)
        finally:
            await sender.close()
        assert server.files() == ["MSG00001-41.hl7", "MSG00002-42.hl7"]  # no .part left
        assert (server.inbox / "MSG00001-41.hl7").read_bytes() == normalise_terminators(message(1))
        assert sender.connections_opened == 1  # one connection for both


async def test_without_a_temporary_name_the_file_is_created_exclusively(tmp_path: Path) -> None:
    async with SftpServer(tmp_path) as server:
        sender = SftpSender(config(server, temporary_name=None))
        try:
            await sender.send(message(1), item_id=1)
        finally:
            await sender.close()
        assert server.files() == ["MSG00001-1.hl7"]


@pytest.mark.parametrize("temporary_name", [".{name}.part", None])
async def test_an_existing_file_is_an_error_and_is_kept(
    tmp_path: Path, temporary_name: str | None
) -> None:
    async with SftpServer(tmp_path) as server:
        (server.inbox / "MSG00001-5.hl7").write_bytes(b"theirs")
        sender = SftpSender(config(server, temporary_name=temporary_name))
        try:
            with pytest.raises(DeliveryError) as info:
                await sender.send(message(1), item_id=5)
        finally:
            await sender.close()
        assert info.value.outcome == "rejected" and "exists" in info.value.detail
        assert (server.inbox / "MSG00001-5.hl7").read_bytes() == b"theirs"
        assert server.files() == ["MSG00001-5.hl7"]


async def test_a_server_with_another_host_key_is_refused(tmp_path: Path) -> None:
    async with SftpServer(tmp_path / "a") as server, SftpServer(tmp_path / "b") as other:
        # the other server's key, for this server's address: never trusted
        known = other.secret_dir / "known_hosts"
        known.write_text(known.read_text().replace(f":{other.port} ", f":{server.port} "))
        sender = SftpSender(config(server, known_hosts_file=str(known)))
        with pytest.raises(DeliveryError) as info:
            await sender.send(message(1), item_id=1)
        await sender.close()
        assert info.value.outcome == "unreachable"
        assert server.files() == []


async def test_password_login_and_a_wrong_password(tmp_path: Path) -> None:
    async with SftpServer(tmp_path) as server:
        password = str(server.secret_dir / "password")
        sender = SftpSender(config(server, private_key_file=None, password_file=password))
        try:
            await sender.send(message(3), item_id=3)
        finally:
            await sender.close()
        assert server.files() == ["MSG00003-3.hl7"]
        wrong = tmp_path / "wrong"
        wrong.write_text("nope\n")
        sender = SftpSender(config(server, private_key_file=None, password_file=str(wrong)))
        with pytest.raises(DeliveryError) as info:
            await sender.send(message(4), item_id=4)
        await sender.close()
        assert info.value.outcome == "unreachable"


async def test_a_missing_directory_is_a_rejection(tmp_path: Path) -> None:
    async with SftpServer(tmp_path) as server:
        sender = SftpSender(config(server, directory="/nowhere"))
        with pytest.raises(DeliveryError) as info:
            await sender.send(message(1), item_id=1)
        await sender.close()
        assert info.value.outcome == "rejected"


async def test_a_message_without_msh10_is_unsendable(tmp_path: Path) -> None:
    """No file name can ever be made for it: no retry can help (kind 5)."""
    async with SftpServer(tmp_path) as server:
        sender = SftpSender(config(server))
        with pytest.raises(DeliveryError) as info:
            await sender.send(b"MSH|^~\\&|A|B|C|D|2026||ADT^A01||P|2.5\r", item_id=1)
        await sender.close()
        assert info.value.outcome == "unsendable"
        assert server.files() == []


async def test_a_worker_drains_its_queue_into_files_in_order(fresh_db: str, tmp_path: Path) -> None:
    async with SftpServer(tmp_path) as server:
        retry = dataclasses.replace(FAST_RETRY, timeout_seconds=10)
        cfg = worker_config(DEST, config(server), channel="adt", retry=retry)
        (server.inbox / "MSG00002-2.hl7").write_bytes(b"in the way")  # item 2 must wait
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            ids = await queue.enqueue(
                conn,
                [NewItem(DEST, "adt", f"MSG{n:05d}", "ADT^A03", message(n)) for n in (1, 2, 3)],
            )
        names = [f"MSG{n:05d}-{i}.hl7" for n, i in zip((1, 2, 3), ids, strict=True)]
        (server.inbox / "MSG00002-2.hl7").rename(server.inbox / names[1])
        async with (
            worker(cfg, fresh_db),
            await AsyncConnection.connect(fresh_db, autocommit=True) as conn,
        ):
            async with asyncio.timeout(30):
                while await _attempts(conn, ids[1]) < 2:
                    await asyncio.sleep(0.1)
            assert server.files() == sorted(names[:2])  # the third waits behind the second
            item = await reads.get_item(conn, ids[1])
            assert item is not None and item.last_error is not None
            assert item.last_error.startswith("rejected: ")
            (server.inbox / names[1]).unlink()  # the partner removes the stale file
            async with asyncio.timeout(30):
                while not await _all_delivered(conn, ids):
                    await asyncio.sleep(0.1)
        assert server.files() == sorted(names)
        for n, name in zip((1, 2, 3), names, strict=True):
            assert (server.inbox / name).read_bytes() == normalise_terminators(message(n))


async def _attempts(conn: AsyncConnection[Any], item_id: int) -> int:
    item = await reads.get_item(conn, item_id)
    return item.attempts if item else 0


async def _all_delivered(conn: AsyncConnection[Any], ids: list[int]) -> bool:
    items = [await reads.get_item(conn, i) for i in ids]
    return all(i is not None and i.state == "delivered" for i in items)


MANIFEST: dict[str, Any] = {
    "apiVersion": "inturn.dev/v1alpha1",
    "kind": "Destination",
    "metadata": {"name": "billing-drop", "namespace": "hospital", "uid": "u-1", "generation": 1},
    "spec": {
        "channel": "adt",
        "sender": {
            "sftp": {
                "host": "sftp.partner.example",
                "username": "hospital",
                "secretRef": {"name": "partner-sftp", "privateKeyKey": "id_ed25519"},
                "directory": "inbound",
            }
        },
        "retry": {"maxAttempts": 0},
    },
}


def test_the_rendered_worker_mounts_the_secret_and_reads_its_files() -> None:
    children = render(MANIFEST, WorkerPodSettings(image="ghcr.io/example/inturn:0.1.0"))
    pod = children.deployment["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "partner-sftp"
    assert sorted(i["key"] for i in volume["secret"]["items"]) == ["id_ed25519", "known_hosts"]
    sftp = children.worker_config["sender"]["sftp"]
    assert sftp["knownHostsFile"] == "/etc/inturn/secrets/partner-sftp/known_hosts"
    assert sftp["privateKeyFile"] == "/etc/inturn/secrets/partner-sftp/id_ed25519"
    assert sftp["port"] == 22 and sftp["fileName"] == "{controlId}-{id}.hl7"
    assert sender_summary(MANIFEST["spec"]) == "sftp://hospital@sftp.partner.example:22/~/inbound"
    cfg = load_manifest(MANIFEST)
    assert isinstance(cfg.sender, SftpSenderConfig) and cfg.sender.password_file is None


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (
            {"secretRef": {"name": "s"}},
            "spec.sender.sftp.secretRef: exactly one of privateKeyKey and passwordKey must be set",
        ),
        ({"fileName": "out.hl7"}, "spec.sender.sftp: fileName must contain {id} or {controlId}"),
        ({"fileName": "../{id}"}, "spec.sender.sftp.fileName: '../{id}' does not match"),
        ({"temporaryName": "{name}"}, "spec.sender.sftp: temporaryName must contain {name}"),
        ({"host": None}, "spec.sender.sftp.host: must be a string"),
    ],
)
def test_bad_sftp_settings_are_named_by_field(change: dict[str, Any], error: str) -> None:
    doc = {**MANIFEST, "spec": {**MANIFEST["spec"]}}
    doc["spec"]["sender"] = {"sftp": {**MANIFEST["spec"]["sender"]["sftp"], **change}}
    with pytest.raises(ManifestError) as info:
        load_manifest(doc)
    assert any(e.startswith(error) for e in info.value.errors), info.value.errors


async def test_a_receiver_profile_shapes_the_file_and_keeps_its_name(
    fresh_db: str, tmp_path: Path
) -> None:
    """Issue 42: the file holds the message as the profile shapes it (MSH-5, MSH-13, ASCII
    transliterated); its name still comes from MSH-10, which no profile changes."""
    from inturn.worker.hl7.profile import compile_profile

    profile = compile_profile(
        {
            "set": {"MSH-5": "BILL_NORTH"},
            "sequenceNumbers": True,
            "charset": {"to": "ASCII", "unmappable": "transliterate", "whenUndeclared": "UTF-8"},
        }
    )
    stored = message(1).replace(b"DOE^JANE", "DOË^JANE".encode())
    async with SftpServer(tmp_path) as server:
        retry = dataclasses.replace(FAST_RETRY, timeout_seconds=10)
        cfg = worker_config(DEST, config(server), channel="adt", retry=retry, profile=profile)
        async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            (item,) = await queue.enqueue(
                conn, [NewItem(DEST, "adt", "MSG00001", "ADT^A03", stored)]
            )
            async with worker(cfg, fresh_db), asyncio.timeout(30):
                while not await _all_delivered(conn, [item]):
                    await asyncio.sleep(0.1)
        name = f"MSG00001-{item}.hl7"
        assert server.files() == [name]
        assert (server.inbox / name).read_bytes() == (
            b"MSH|^~\\&|ADT|HOSP|BILL_NORTH|HOSP|20261130120000||ADT^A03|MSG00001|P|2.5|1|||||"
            b"ASCII\rPID|1||P1^^^HOSP^MR||DOE^JANE\r"
        )
