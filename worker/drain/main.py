"""The runtime of one worker process: what ``inturn worker`` becomes once its configuration is
validated.

``inturn worker`` reads and validates its configuration file (YAML parser, JSON-schema
validator, the command-line library), then replaces its own process image (``execv``, same PID,
same signals) by ``python -m inturn.worker.drain.main``, handing over the validated
configuration in the environment variable :data:`RUNTIME_ENV`. This module imports only what
draining needs (psycopg, the sender, prometheus-client, and the worklist publishers that the
``INTURN_WORKLIST_*`` variables ask for), so none of the validation's modules,
about 6 MiB, stays resident in each of a thousand worker pods.

On SIGTERM or SIGINT the attempt in flight is finished or times out, the lock is released, and
the process exits 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any

import psycopg.errors

from inturn.worker import tracing
from inturn.worker.crypto.errors import REFUSALS, MasterKeyError
from inturn.worker.drain import shutdown
from inturn.worker.drain.health import make_app, serve
from inturn.worker.drain.metrics import PrometheusObserver
from inturn.worker.drain.runner import DestinationWorker
from inturn.worker.operations.payload_keys import close_codec, open_codec
from inturn.worker.senders.registry import make_sender
from inturn.worker.spec.config import WorkerConfig, from_dict, to_dict
from inturn.worker.store.connect import announce_pooling
from inturn.worker.store.dsn import schema_missing
from inturn.worker.store.faults import SCHEMA_CODES
from inturn.worker.text.logs import configure
from inturn.worker.worklist.publishers import close_all, from_env

log = logging.getLogger("inturn.drain")

#: The environment variable that carries the validated runtime settings (JSON).
RUNTIME_ENV = "INTURN_WORKER_RUNTIME"


def runtime_settings(
    config: WorkerConfig,
    dsn: str,
    http_host: str,
    http_port: int,
    log_level: str,
    log_json: bool,
    payload_keys: str | None = None,
    key_dsn: str | None = None,
) -> str:
    """The JSON text :func:`main` reads back: the configuration and the process's options
    (the master keys' folder and the key store's DSN, not keys)."""
    return json.dumps(
        {
            "config": to_dict(config),
            "dsn": dsn,
            "httpHost": http_host,
            "httpPort": http_port,
            "logLevel": log_level,
            "logJson": log_json,
            "payloadKeys": payload_keys,
            "keyDsn": key_dsn,
        }
    )


def exec_runtime(settings: str) -> None:
    """Replace this process by the worker runtime with ``settings``; returns only on failure.

    Raises:
        OSError: the interpreter could not be executed (the caller may run in-process instead).
    """
    env = {**os.environ, RUNTIME_ENV: settings}
    sys.stdout.flush()
    sys.stderr.flush()
    # -P: the working directory is not put on sys.path (a checkout's operator/ would shadow
    # the standard library's operator module).
    os.execve(sys.executable, [sys.executable, "-P", "-m", "inturn.worker.drain.main"], env)


async def run_worker(
    config: WorkerConfig,
    dsn: str,
    http_host: str,
    http_port: int,
    payload_keys: str | None = None,
    key_dsn: str | None = None,
) -> None:
    """Run one worker and its HTTP endpoints until SIGTERM, SIGINT or SIGHUP (a second one
    abandons the attempt in flight: see :mod:`inturn.worker.drain.shutdown`).

    Raises:
        OSError: the HTTP port is taken.
        MasterKeyError: the payload keys are unusable at start (a payload met later that
            cannot be opened holds the queue at it instead: see
            :meth:`inturn.worker.drain.outcome.Outcomes._open_or_hold`).
        PayloadKeysMissing: a sealed head, and no payload keys were given (one line, exit 2).
    """
    stop, abandon = asyncio.Event(), asyncio.Event()
    shutdown.install(stop, abandon)
    try:
        payloads = await open_codec(payload_keys, key_dsn, application_name="inturn-worker-keys")
    except psycopg.Error as exc:  # the key store, at start: one line, as for wrong keys
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise MasterKeyError(f"--key-dsn: the key store cannot be used: {first}") from None
    publishers = from_env(os.environ, dsn)
    worker = DestinationWorker(
        config,
        dsn,
        make_sender(config.sender, body_charset=config.body_charset),
        PrometheusObserver(),
        publishers,
        payloads=payloads,
    )
    runner = await serve(make_app([worker]), http_host, http_port)
    log.info("worker for %s started (http %s:%d)", config.destination, http_host, http_port)
    task = asyncio.create_task(worker.run(stop))
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
        await shutdown.finish([(worker, task)], abandon)
        if not task.cancelled():
            task.result()  # a worker that ended by itself: its error
    finally:
        stopping.cancel()
        await runner.cleanup()
        await close_all(publishers)
        await close_codec(payloads)
        log.info("worker for %s stopped", config.destination)


def run(settings: dict[str, Any]) -> int:
    """Run the worker ``settings`` describe (as :func:`runtime_settings` wrote them); exit code."""
    configure(str(settings["logLevel"]), bool(settings["logJson"]))
    try:
        tracing.configure("inturn-worker")
    except tracing.TracingError as exc:
        print(f"inturn: error: {exc}", file=sys.stderr)
        return 2
    config = from_dict(settings["config"])
    announce_pooling()
    try:
        asyncio.run(
            run_worker(
                config,
                str(settings["dsn"]),
                settings["httpHost"],
                settings["httpPort"],
                settings.get("payloadKeys"),
                settings.get("keyDsn"),
            )
        )
    except REFUSALS as exc:  # never sent: the message stays at the head
        print(f"inturn: error: destination {config.destination}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"inturn: error: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except psycopg.Error as exc:
        if exc.sqlstate not in SCHEMA_CODES:  # the worker stops only for these (classify_step)
            raise
        print(f"inturn: error: {schema_missing(exc)}", file=sys.stderr)
        return 2
    return 0


def main() -> None:
    """Entry point of ``python -m inturn.worker.drain.main`` (started by ``inturn worker``)."""
    text = os.environ.pop(RUNTIME_ENV, None)
    if not text:
        print("inturn: error: start workers with `inturn worker`", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(json.loads(text)))


if __name__ == "__main__":
    main()
