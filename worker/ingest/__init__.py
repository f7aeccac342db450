"""Ingest: MLLP and HTTP listeners that store a message for every destination, then acknowledge.

The entry points: :class:`Ingest` (run it in-process, as ``inturn local`` does), configured by
:class:`IngestConfig` and one :class:`ListenerConfig` per MLLP channel; and the click command
``inturn.worker.cli.ingest:ingest_command`` (``inturn ingest``).

Layer: front end (a long-running process). It may use worklists, the store, senders, feeds'
and orders' keys, the Destination API and hl7; its SQL runs from ``store/ingest.py``.
"""

from inturn.worker.ingest.config import IngestConfig, server_tls_context
from inturn.worker.ingest.listener import ListenerConfig
from inturn.worker.ingest.service import Ingest

__all__ = ["Ingest", "IngestConfig", "ListenerConfig", "server_tls_context"]
