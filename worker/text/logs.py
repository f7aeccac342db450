"""Logging setup for every long-running command: compact text lines, or JSON for log shippers.

Per-message events are logged at DEBUG only, and never with payloads
(docs/explanation/guarantees.md, "Payloads stay out"). Every message is rendered with its
control characters escaped (:class:`inturn.worker.text.display.PrintableFilter`),
in text and in JSON.
"""

from __future__ import annotations

import logging
import sys

from inturn.worker.text.display import PrintableFilter

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def configure(level: str = "INFO", json_logs: bool = False) -> None:
    """Send log records at ``level`` and above to stderr, as text or one JSON object per line.

    Raises:
        ValueError: ``level`` is not a logging level name.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        # Imported only when asked for: a worker logging text keeps it out of its memory.
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"levelname": "level", "asctime": "time"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT, datefmt="%H:%M:%S"))
    # Text from outside (error texts, MSH fields) cannot start a line that looks like ours.
    handler.addFilter(PrintableFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # The pools' own reconnect chatter repeats what our lifecycle lines already say.
    logging.getLogger("psycopg.pool").setLevel(max(numeric, logging.WARNING))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("pgserver").setLevel(max(numeric, logging.WARNING))
