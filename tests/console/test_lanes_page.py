"""A destination with lanes on the console: which messages its lanes send now or next, and
what holds its oldest waiting message (here, one patient's failing message)."""

from __future__ import annotations

from psycopg import AsyncConnection

from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from tests.support.console import Client, message
from tests.support.db import register

DEST = "ward/lanes"


async def test_the_destination_page_shows_what_holds_a_lane(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await register(conn, DEST, "adt", lanes=4)
        # patients 1, 2, 1, 3: the second message of patient 1 waits for the first, which
        # failed and backs off for a minute
        ids = await queue.enqueue(
            conn,
            [
                NewItem(DEST, "adt", f"MSG{i}", "ADT^A01", message(n, f"MSG{i}"))
                for i, n in enumerate((1, 2, 1, 3))
            ],
        )
        await conn.execute(
            "UPDATE inturn_delivery SET attempts = 2, last_error = 'AE: no',"
            " next_attempt = clock_timestamp() + interval '60 s' WHERE id = %s",
            (ids[0],),
        )
    status, page = await clients["viewer"].get(f"/destinations/{DEST}")
    assert status == 200
    assert 'id="lanes"' in page and "up to 4 messages in flight" in page
    heads = page.split('id="lanes-heads"', 1)[1].split("</p>", 1)[0]
    assert f">{ids[1]}</a>" in heads and f">{ids[3]}</a>" in heads and f">{ids[2]}<" not in heads
    oldest = page.split('id="lanes-oldest"', 1)[1].split("</p>", 1)[0]
    assert f">{ids[0]}</a>" in oldest and "its last attempt failed" in oldest
    assert "Oldest pending message: its patient" in page
    # one lane: no lanes section, the head as before
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute("UPDATE inturn_destination SET lanes = 1")
    _, single = await clients["viewer"].get(f"/destinations/{DEST}")
    assert 'id="lanes"' not in single and "everything else waits behind it" in single
