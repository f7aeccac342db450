"""An embedded Postgres for ``inturn local``, the demo and benchmarks (the ``pgserver`` package).

The data directory is kept between runs, so a stopped and restarted ``inturn local`` finds its
backlog. pgserver ships its own Postgres binaries; nothing needs to be installed.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("inturn.local")


@dataclass
class EmbeddedPostgres:
    """A running embedded server.

    Attributes:
        dsn: a libpq URI reaching it over its Unix socket.
        data_dir: where its files live.
    """

    dsn: str
    data_dir: Path
    _server: Any

    def stop(self) -> None:
        """Stop the server; its data stays in :attr:`data_dir`."""
        self._server.cleanup()


def start_embedded(data_dir: Path) -> EmbeddedPostgres:
    """Start (or re-attach to) the embedded Postgres whose data lives in ``data_dir``/pg.

    Raises:
        RuntimeError: the server could not start (the message says why).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs complains about XDG_RUNTIME_DIR
        from pgserver import get_server  # type: ignore[attr-defined]

    pgdata = (data_dir / "pg").resolve()
    pgdata.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:  # pgserver raises plain exceptions with the server's log
        raise RuntimeError(f"embedded Postgres in {pgdata} did not start: {exc}") from exc
    return EmbeddedPostgres(dsn=server.get_uri(), data_dir=pgdata, _server=server)
