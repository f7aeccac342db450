"""One attempt's send, and how its failure is classified.

Shared by every path that sends (the single stream of :mod:`inturn.worker.drain.stream` and the
lanes of :mod:`inturn.worker.drain.lane_runner`), so that a timeout, a refused connection and a
negative acknowledgement mean the same thing whichever path met them.
"""

from __future__ import annotations

import asyncio

from inturn.worker.senders.base import DeliveryError, FailureCause, Sender


async def send_once(
    sender: Sender, payload: bytes, item_id: int, timeout_seconds: float
) -> tuple[FailureCause, str] | None:
    """Send ``payload`` once through ``sender`` within ``timeout_seconds``.

    Returns:
        None when the receiver accepted it; else ``(outcome, detail)``: the sender's own
        outcome (``AE``, ``AR``...), ``timeout`` (written, no answer in time), ``unreachable``
        (nothing could be written: no connection in time, refused, DNS) or ``connection`` (the
        connection failed after the message was written).
    """
    try:
        async with asyncio.timeout(timeout_seconds):
            await sender.send(payload, item_id=item_id)
    except DeliveryError as exc:
        return exc.outcome, exc.detail
    except TimeoutError:
        if sender.written:
            return "timeout", f"no answer within {timeout_seconds:g}s"
        return "unreachable", f"no connection within {timeout_seconds:g}s"
    except OSError as exc:
        return ("connection" if sender.written else "unreachable"), str(exc) or type(exc).__name__
    return None
