"""Storing an HL7 batch (FHS/BHS ... BTS/FTS): all of its messages, or none of them.

Source: HL7 v2.5 chapter 2, section 2.10.3 "HL7 batch protocol" (splitting and the answering
batch are pure, in :mod:`inturn.worker.hl7.batch`; the answers are built by
:class:`inturn.worker.ingest.accept.Acceptor`). The rules ingest applies, over MLLP and HTTP
alike:

* Each message of the batch goes through exactly the checks a message sent alone goes through
  (MSH readable, bounded fields, a destination that takes it and could send it).
* When every message passes, all of them are stored **in one transaction**, in batch order:
  the enqueue locks of every destination involved are taken first, in sorted order (two
  batches never wait on each other in a cycle), then each message is stored by the same
  statement a single message uses (duplicate window, identifier index, NOTIFY at COMMIT), so
  per destination ids ascend in batch order. The answer is a batch of ACKs, one per message
  in order (AA, or AA with "duplicate" in MSA-3), after the COMMIT.
* When a message would be refused, the batch is **refused whole** and nothing of it is
  stored: the refused message's ACK carries its own ERR; every other message is answered
  AR (CR) with an ERR (table 0357 code 207) naming the refused message by its position and
  MSH-10; BHS-10 says the same.
* When storing fails, every message is answered AE (CE), or AR (CR) for content the database
  refuses (:mod:`inturn.worker.store.faults`); nothing is kept, the sender sends it again.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg_pool import AsyncConnectionPool

from inturn.worker.ingest.batch import Message, StoreResult, store_statement
from inturn.worker.store.queries import load

_QUEUE = load("queue.sql")


async def store_all(
    pool: AsyncConnectionPool,
    channel: str,
    items: Sequence[tuple[Sequence[str], Message]],
    *,
    window_seconds: float,
    acquire_timeout: float,
) -> list[StoreResult]:
    """Store every message for its destinations in one transaction, in order.

    Args:
        pool: the write pool (autocommit connections, ``synchronous_commit`` on).
        channel: where the batch arrived.
        items: ``(destinations, message)`` per message of the batch, in batch order.
        window_seconds: the duplicate window (0 turns it off).
        acquire_timeout: seconds to wait for a pooled connection.

    Returns:
        One result per item, in order, once the COMMIT has returned.

    Raises:
        psycopg.Error, psycopg_pool.PoolTimeout: nothing of the batch was stored.
    """
    everyone = sorted({d for destinations, _ in items for d in destinations})
    async with pool.connection(timeout=acquire_timeout) as conn, conn.transaction():
        for destination in everyone:
            await conn.execute(_QUEUE["enqueue_lock"], {"destination": destination})
        results: list[StoreResult] = []
        for destinations, message in items:
            [result] = await store_statement(
                conn,
                channel=channel,
                destinations=destinations,
                messages=[message],
                window_seconds=window_seconds,
            )
            results.append(result)
        return results
