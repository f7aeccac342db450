"""Prometheus metrics of ingest, in prometheus-client's default registry.

They share the registry with the worker's metrics, so ``inturn local`` serves both from one
``/metrics``. Labels never carry payload content: only the channel name, ACK codes and fixed
words.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

MESSAGES = Counter(
    "inturn_ingest_messages",
    "Messages answered by ingest, by channel and acknowledgement code (AA, AE, AR, CA, CE, CR;"
    " unknown: left unanswered, the outcome of its cancelled store not seen).",
    ["channel", "code"],
)
DUPLICATES = Counter(
    "inturn_ingest_duplicates",
    "Messages seen again inside the duplicate window, by kind: 'identical' (same MSH-10 and"
    " bytes while the earlier copy is pending or was just delivered: acknowledged, not stored"
    " again, logged with the earlier copy's id), 'resent' (same MSH-10 and bytes after the"
    " earlier copy failed, was skipped or erased, or was delivered longer ago: queued again,"
    " linked to it) or 'control_id_reused' (same MSH-10, other bytes: stored, since it is a"
    " different message).",
    ["channel", "kind"],
)
STORE_SECONDS = Histogram(
    "inturn_ingest_store_seconds",
    "Seconds from a complete frame (or HTTP body) received to the COMMIT of its rows.",
    ["channel"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
CONNECTIONS = Gauge("inturn_ingest_connections", "Open MLLP connections, by channel.", ["channel"])
GARBAGE_BYTES = Counter(
    "inturn_ingest_garbage_bytes",
    "Bytes received outside any MLLP block (neither start-block nor filler) and dropped.",
    ["channel"],
)
CLOSED = Counter(
    "inturn_ingest_connections_closed",
    "MLLP connections closed by ingest, by reason (idle, stalled, too_large, shutdown).",
    ["channel", "reason"],
)
HTTP_REFUSED = Counter(
    "inturn_ingest_http_refused",
    "HTTP message requests refused before anything was read, by reason: 'unauthenticated'"
    " (401: no valid credential) or 'forbidden' (403: the credential does not name the channel).",
    ["reason"],
)
REFUSED_CONNECTIONS = Counter(
    "inturn_ingest_connections_refused",
    "MLLP connections refused by a channel's allow-list before any message was read, by channel"
    " and reason: 'network' (source address outside the allowed networks) or 'subject' (no"
    " client certificate with an allowed CN or SAN).",
    ["channel", "reason"],
)

UNROUTED = Counter(
    "inturn_ingest_unrouted",
    "Messages no destination takes, by channel, reason ('no_destinations': the channel has none;"
    " 'filtered': no destination's filter, on its type or its fields, takes it) and outcome, as"
    " the channel declares: 'rejected' (AR), 'held' (stored for _unrouted/CHANNEL, AA) or"
    " 'dropped' (AA, not stored: Mirth Connect's FILTERED).",
    ["channel", "reason", "outcome"],
)
REPLIES = Counter(
    "inturn_ingest_replies",
    "Replies (spec.replies) stored, by whether they answered an open order: matched, unmatched"
    " (counted, never placed on a worklist)",
    ["channel", "outcome"],
)
BUSY = Counter(
    "inturn_ingest_busy",
    "Messages (MLLP frames, HTTP bodies) answered AE 'busy' because ingest's memory budget had no"
    " room for them in time, by channel; nothing of them was kept.",
    ["channel"],
)
BUDGET_BYTES = Gauge(
    "inturn_ingest_memory_budget_bytes",
    "Bytes of message memory ingest may hold at once (frames being read, messages being stored,"
    " 64 KiB per open MLLP connection), from its memory limit.",
)
BUDGET_USED_BYTES = Gauge(
    "inturn_ingest_memory_held_bytes",
    "Bytes of message memory ingest holds now, of inturn_ingest_memory_budget_bytes.",
)
