"""``inturn keys ...``: the key store and the master keys of payload encryption (issue 31).

``init`` makes the key store's tables (and, with ``--new-key``, a first master key file);
``new`` writes a master key file; ``status`` says which master keys are in use; ``rotate``
re-wraps every patient and destination key under the newest master key (payloads untouched,
resumable); ``encrypt-existing`` seals the rows written before the keys were given;
``rotate-index`` replaces the blind index key and re-indexes everything under the new one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from inturn.worker.cli.options import (
    audit_who_option,
    dsn_option,
    key_dsn_option,
    payload_keys_option,
    payload_keys_options,
)
from inturn.worker.crypto.codec import PayloadCodec
from inturn.worker.crypto.masterkeys import MasterKeyError, new_key_file
from inturn.worker.operations.payload_keys import close_codec, open_codec
from inturn.worker.store.keystore import create_schema

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _with_codec(
    payload_keys: str | None, key_dsn: str | None, use: Callable[[PayloadCodec], Awaitable[T]]
) -> T:
    if not payload_keys or not key_dsn:
        raise MasterKeyError("this command needs --payload-keys and --key-dsn")

    async def go() -> T:
        codec = await open_codec(payload_keys, key_dsn, application_name="inturn-keys-cli")
        try:
            return await use(codec)
        finally:
            await close_codec(codec)

    return asyncio.run(go())


def _batch_option(help: str) -> Callable[[F], F]:
    """``--batch N`` (1 to 100,000; 500 by default): ``help`` says what is counted."""
    return click.option(
        "--batch", default=500, show_default=True, type=click.IntRange(1, 100_000), help=help
    )


@click.group("keys")
def keys_group() -> None:
    """Payload encryption: the key store and the master keys."""


@keys_group.command("init")
@key_dsn_option(required=True, help="The key store.")
@click.option(
    "--new-key",
    "new_key",
    default=None,
    metavar="DIR/ID",
    help="Also write a fresh master key file there (refused if it exists).",
)
def init_command(key_dsn: str, new_key: str | None) -> None:
    """Make the key store's tables (idempotent); run it with a role that may create them."""
    create_schema(key_dsn)
    click.echo("key store ready")
    if new_key:
        folder, _, key_id = new_key.rpartition("/")
        click.echo(f"master key written: {new_key_file(folder or '.', key_id)}")


@keys_group.command("new")
@payload_keys_option(required=True, help="Folder of master keys.")
@click.argument("key_id")
def new_command(payload_keys: str, key_id: str) -> None:
    """Write a fresh master key KEY_ID into the folder (name it to sort after the others:
    the newest wraps new keys; then ``inturn keys rotate``)."""
    click.echo(f"master key written: {new_key_file(payload_keys, key_id)}")


@keys_group.command("status")
@payload_keys_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status_command(payload_keys: str | None, key_dsn: str | None, as_json: bool) -> None:
    """Which master keys are in use: how many keys each wraps, which wraps the blind index key,
    and whether the folder lacks one the key store needs."""
    status: dict[str, Any] = _with_codec(payload_keys, key_dsn, lambda c: c.status())
    if as_json:
        click.echo(json.dumps(status, sort_keys=True))
        return
    wrapping: dict[str, int] = status["wrapping"]
    previous = status.get("index_previous_master") or ""
    for key_id in sorted(
        {*status["folder"], *wrapping, status["index_master"]} | ({previous} - {""})
    ):
        uses = []
        if wrapping.get(key_id):
            uses.append(f"wraps {wrapping[key_id]} keys")
        if key_id == status["index_master"]:
            uses.append("wraps the blind index key")
        if key_id == previous:
            uses.append("wraps the previous blind index key")
        if key_id == status["newest"]:
            uses.append("newest: new wraps")
        where = "MISSING from the folder" if key_id in status["missing"] else "in the folder"
        click.echo(f"{key_id}: {where}; " + ("; ".join(uses) or "not in use: may be removed"))
    rotation = status.get("index_rotation") or ""
    click.echo(
        f"blind index key: generation {status.get('index_generation', 1)}"
        + (
            f"; a rotation is under way ({rotation}): run `inturn keys rotate-index` to finish"
            if rotation
            else ""
        )
    )


@keys_group.command("rotate")
@payload_keys_options
@_batch_option("Keys re-wrapped per round trip to the key store.")
def rotate_command(payload_keys: str | None, key_dsn: str | None, batch: int) -> None:
    """Re-wrap every key under the newest master key (resumable; payloads untouched)."""
    done = _with_codec(payload_keys, key_dsn, lambda c: c.rotate(batch=batch))
    click.echo(f"re-wrapped {done} keys")


@keys_group.command("encrypt-existing")
@dsn_option("The queue's database.")
@payload_keys_options
@_batch_option("Rows sealed per transaction.")
def encrypt_existing_command(
    dsn: str | None, payload_keys: str | None, key_dsn: str | None, batch: int
) -> None:
    """Encrypt the payloads stored in clear before the keys were given, in batches, while
    ingest and the workers run (a message is readable in both forms meanwhile); then keep
    only the blind form of their patient index. Resumable: run it again to finish."""
    done = _encrypt(dsn, payload_keys, key_dsn, batch)
    click.echo(
        f"sealed {done.sealed} row(s); {done.rekeyed} sealed row(s) now indexed in the blind"
        " form alone"
    )
    if done.pending_in_clear:
        raise click.ClickException(
            "pending rows in clear remain (a process without --payload-keys is storing?):"
            " run it again once every ingest has the keys"
        )


def _encrypt(dsn: str | None, payload_keys: str | None, key_dsn: str | None, batch: int) -> Any:
    from inturn.worker.cli.db import run_write, with_payloads
    from inturn.worker.operations.payload_keys import encrypt_existing

    if not payload_keys or not key_dsn:
        raise MasterKeyError("this command needs --payload-keys and --key-dsn")

    def progress(text: str) -> None:
        click.echo(text, err=True)

    return run_write(
        dsn,
        lambda conn: with_payloads(
            payload_keys,
            key_dsn,
            lambda codec: encrypt_existing(conn, codec, batch=batch, progress=progress),
        ),
    )


@keys_group.command("rotate-index")
@dsn_option("The queue's database.")
@payload_keys_options
@_batch_option("Rows re-indexed per transaction.")
@audit_who_option
def rotate_index_command(
    dsn: str | None, payload_keys: str | None, key_dsn: str | None, batch: int, who: str
) -> None:
    """Replace the blind index key (the key of the patient index's digests) by a new one while
    ingest and the workers run: every row and patient key is re-indexed in batches, lookups
    and erasure find both forms meanwhile, and the old key is destroyed once nothing needs it
    (it says what still does otherwise). Resumable: run it again to finish."""
    from inturn.worker.cli.db import run_write, with_payloads
    from inturn.worker.operations.payload_keys import rotate_index

    if not payload_keys or not key_dsn:
        raise MasterKeyError("this command needs --payload-keys and --key-dsn")

    def progress(text: str) -> None:
        click.echo(text, err=True)

    done = run_write(
        dsn,
        lambda conn: with_payloads(
            payload_keys,
            key_dsn,
            lambda codec: rotate_index(conn, codec, actor=who, batch=batch, progress=progress),
        ),
    )
    click.echo(
        f"blind index key generation {done.generation}: {done.rows} row(s) and {done.keys}"
        " patient key(s) re-indexed; "
        + (
            "the previous key is destroyed"
            if done.finished
            else f"the previous key is kept for {done.unreached} unreached key(s) and"
            f" {done.open_orders} awaited order reply(ies): run it again later"
        )
    )
