"""The channel log in tests: messages appended as ingest appends them, and the epochs put back
as migration 0034 left them (shared by the pull, history, readers and upgrade tests)."""

from __future__ import annotations

from typing import Any

import psycopg

#: The channel the tests' log rows belong to.
CHANNEL = "adt"


def append(
    conn: psycopg.Connection[Any],
    route: list[str],
    n: int,
    tag: str = "C",
    *,
    channel: str = CHANNEL,
) -> list[int]:
    """Append ``n`` messages routed to ``route`` (MSH-10 ``<tag><i>``, one patient key ``k1``) to
    ``channel``'s log, as ingest does (one route set row); their log ids."""
    conn.execute(
        "INSERT INTO inturn_route (channel, destinations) VALUES (%s, %s)"
        " ON CONFLICT (channel, destinations) DO NOTHING",
        (channel, sorted(route)),
    )
    [(route_id,)] = conn.execute(
        "SELECT id FROM inturn_route WHERE channel = %s AND destinations = %s",
        (channel, sorted(route)),
    ).fetchall()
    ids = []
    for i in range(n):
        payload = f"MSH|^~\\&|A|B|C|D|2026||ADT^A01|{tag}{i}|P|2.5\r".encode()
        [(log_id,)] = conn.execute(
            "INSERT INTO inturn_message (channel, control_id, message_type, payload, size, route,"
            " patient_keys) VALUES (%s, %s, 'ADT^A01', %s, %s, %s, '{k1}') RETURNING id",
            (channel, f"{tag}{i}", payload, len(payload), route_id),
        ).fetchall()
        ids.append(log_id)
    return ids


def reset_epochs(dsn: str) -> None:
    """Put the epochs back as migration 0034 left them: epoch 1 open with its two partitions,
    no other (fresh_db empties the tables but keeps inturn_epoch and the partitions)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        extra = conn.execute(
            "SELECT relname FROM pg_class WHERE relname ~ '^inturn_(message|history)_e[0-9]+$'"
            " AND relnamespace = to_regnamespace(current_schema())"
        ).fetchall()
        for (name,) in extra:
            conn.execute(f'DROP TABLE "{name}"')
        for parent in ("inturn_message", "inturn_history"):
            conn.execute(
                f"CREATE TABLE {parent}_e1 PARTITION OF {parent}"
                " FOR VALUES FROM (1) TO (1099511627776)"
            )
        conn.execute("DELETE FROM inturn_epoch WHERE n > 1")
        conn.execute(
            "UPDATE inturn_epoch SET opened_at = now(), closed_at = NULL, detached_at = NULL,"
            " dropped_at = NULL WHERE n = 1"
        )
        conn.execute("SELECT setval('inturn_message_id_seq', 1, false)")
        # migration 0052: epoch 1 empty again, counted from its first row
        conn.execute(
            "DO $$ BEGIN IF to_regclass('inturn_epoch_rows') IS NOT NULL THEN"
            " UPDATE inturn_epoch SET counted = true WHERE n = 1;"
            " DELETE FROM inturn_epoch_rows; END IF; END $$"
        )


async def never_stop() -> bool:
    """A maintenance step's ``go_on`` that never asks it to stop."""
    return True
