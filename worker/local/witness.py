"""``inturn local``'s restore witness (issue 39, part 1; docs/howto/backups.md).

Without an operator, ``inturn local`` keeps the witness itself, in a file of its data folder
(``<data dir>/restore-witness.json``), outside the queue database: it moves the database's
clock on (``inturn_clock``) at its start and once a tick, and records the tick with how far
each destination's delivery had gone. A database holding an older tick than the file was
restored (a dump restored into its embedded server, or into a database ``--dsn`` names: that
file keeps one witness per database identity, migration 0055): every
destination is then held (audited as ``inturn-local``) until a person decides
(``inturn queue mark-delivered``, ``inturn queue resume``), with one WARNING line each (which
also names the channel log's messages the restore lost, from the file's ``channelThrough`` and
``channelTime``), and the restore's finding is kept in the database for ``mark-delivered`` as
the operator keeps it.

Limits: a data folder restored together with the database (its file too) cannot tell; the
embedded database's file is the witness of that one database; a database ``--dsn`` names
restored from a dump made before migration 0055 has no identity to match and is not noticed
that once.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection

from inturn.worker.store import registry, restore

log = logging.getLogger("inturn.local")

#: Who the hold after a restore names (registry and audit).
HOLDER = "inturn-local"

#: The witness file's name in the data folder (the embedded database's).
FILE_NAME = "restore-witness.json"
#: The file of the databases ``--dsn`` named, one witness per database identity (migration
#: 0055: a restore keeps it, a database made anew has its own).
KEYED_FILE_NAME = "restore-witnesses.json"


@dataclass(frozen=True)
class Noticed:
    """A restore ``inturn local`` noticed: the destinations held, and one line each."""

    held: tuple[str, ...]
    lines: tuple[str, ...]


def _read(path: Path) -> dict[str, Any] | None:
    """The recorded witness, or None (no file yet, or one that is not ours: said once)."""
    node = _read_any(path)
    if node is None or not isinstance(node.get("tick"), int):
        return None
    return node


def _read_keyed(path: Path, key: str) -> dict[str, Any] | None:
    """The witness recorded for database ``key`` in a keyed file, or None."""
    node = _read_any(path)
    databases = node.get("databases") if node is not None else None
    found = databases.get(key) if isinstance(databases, dict) else None
    if not isinstance(found, dict) or not isinstance(found.get("tick"), int):
        return None
    return found


def _read_any(path: Path) -> dict[str, Any] | None:
    try:
        node = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("restore witness %s unreadable (%s): recorded anew", path, exc)
        return None
    return node if isinstance(node, dict) else None


def _write(path: Path, tick: int, seen: dict[str, restore.Seen], key: str | None = None) -> None:
    """Record ``tick`` and each destination's delivery bounds (written whole, then renamed);
    with ``key``, as database ``key``'s entry of a keyed file, the others kept."""
    node: dict[str, Any] = {
        "tick": tick,
        "destinations": {
            name: {
                "deliveredThrough": s.delivered_through,
                "deliveredMessage": s.delivered_message,
                "deliveredTime": s.delivered_at.isoformat() if s.delivered_at else None,
                "acceptedThrough": s.accepted_through,
                "channelThrough": s.channel_through,
                "channelTime": s.channel_at.isoformat() if s.channel_at else None,
            }
            for name, s in seen.items()
        },
    }
    if key is not None:
        whole = _read_any(path) or {}
        databases = whole.get("databases")
        databases = dict(databases) if isinstance(databases, dict) else {}
        databases[key] = node
        node = {"databases": databases}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    try:
        partial.write_text(json.dumps(node, indent=1))
        os.replace(partial, path)
    except OSError:
        partial.unlink(missing_ok=True)  # no empty leftover beside the last good file
        raise


async def look(conn: AsyncConnection[Any], path: Path, *, keyed: bool = False) -> Noticed | None:
    """Move the database's clock on and compare it with the witness file at ``path``.

    ``keyed``: the file keeps one witness per database identity
    (:func:`inturn.worker.store.restore.database_id`): for a database ``--dsn`` names, which
    may be any of several, while the embedded one's file is its alone.

    Returns:
        What was noticed when the database holds an older tick than the file (every live
        destination held, its finding recorded, one WARNING line each), else None. The file
        then records the tick and the bounds as the database holds them now (after a restore,
        the bounds recorded before are kept in the database's findings, not in the file).

    Raises:
        psycopg.Error: the database failed (the caller looks again at its next tick).
        OSError: the file could not be written (a full disk); the clock was not moved.
    """
    async with conn.transaction():  # the tick is seen with the holds, never before them
        noticed = await _look(conn, path, keyed)
    return noticed


async def _look(conn: AsyncConnection[Any], path: Path, keyed: bool) -> Noticed | None:
    before, now = await restore.tick(conn)
    key = await restore.database_id(conn) if keyed else None
    recorded = _read(path) if key is None else _read_keyed(path, key)
    seen = await restore.witness(conn)
    noticed = None
    for destination in sorted(seen):
        # a restore a person decided (the hold lifted): its finding goes
        if await restore.finding(conn, destination) is not None and not await registry.held(
            conn, destination
        ):
            await restore.forget_finding(conn, destination)
    if recorded is not None and int(recorded["tick"]) > before:
        held, lines = [], []
        bounds = recorded.get("destinations")
        bounds = bounds if isinstance(bounds, dict) else {}
        channels = {d.destination: d.channel for d in await registry.listed(conn)}
        for destination in sorted(seen):
            node = bounds.get(destination)
            node = node if isinstance(node, dict) else {}
            finding = restore.RestoreFinding(
                int(recorded["tick"]),
                _number(node.get("deliveredThrough")),
                _number(node.get("deliveredMessage")),
                _time(node.get("deliveredTime")),
                _number(node.get("acceptedThrough")),
                _number(node.get("channelThrough")),
            )
            # what the log lost, read before the finding moves the id sequences on
            lost = await _lost(conn, destination, finding, _time(node.get("channelTime")))
            await restore.record_finding(conn, destination, finding)
            again = await restore.exposure(conn, destination)
            lost_part = ""
            if lost is not None:
                start = "its first message" if lost[0] is None else _moment(lost[0])
                lost_part = (
                    f"; messages accepted on channel {channels.get(destination, '?')} after"
                    f" {start} up to {_moment(lost[1])} are not in the database: ask the"
                    " senders to send them again"
                )
            line = (
                f"destination {destination}: the queue database went back in time (its clock"
                f" {before}, {path} recorded {recorded['tick']}); {again} message(s) delivered"
                f" before may be sent again{lost_part}; delivery is held until a person"
                f" decides: inturn queue mark-delivered {destination} (what the receiver has:"
                " those delivered before), then inturn queue resume"
            )
            if await registry.suspend(conn, destination, who=HOLDER, why=line[:1000]):
                held.append(destination)
            log.warning("%s", line)
            lines.append(line)
        noticed = Noticed(tuple(held), tuple(lines))
    _write(path, now, seen, key)
    return noticed


async def _lost(
    conn: AsyncConnection[Any],
    destination: str,
    finding: restore.RestoreFinding,
    channel_time: datetime | None,
) -> tuple[datetime | None, datetime] | None:
    """The messages of ``destination``'s channel log the restore lost, ``(after, through)``:
    accepted after ``after`` (None: from the log's first) up to ``through``, the last one the
    witness saw (its ``channelThrough`` at ``channelTime``); None when the restored log still
    holds that one, or the file recorded no bound (one written before ``channelTime``).
    Compared by time up to the witness's last (:func:`inturn.worker.store.restore.kept`),
    so a message accepted after the restore, which may have taken a lost one's id, is no
    proof that nothing was lost."""
    through = finding.channel_through
    if through is None or channel_time is None:
        return None
    kept_through, kept_at = await restore.kept(conn, destination, channel_time)
    if kept_through is not None and kept_through >= through:
        return None
    return kept_at, channel_time


def _time(value: Any) -> datetime | None:
    """A recorded ISO 8601 time, or None (absent or not one)."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _moment(value: datetime) -> str:
    """A time for the WARNING line: UTC, to the millisecond (``2026-12-05T18:30:01.250Z``)."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
