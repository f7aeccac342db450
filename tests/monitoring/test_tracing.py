"""Traces per message, exported by the real OpenTelemetry SDK to a real OTLP/HTTP endpoint.

The endpoint is a small aiohttp server started here that decodes each export request with
``opentelemetry-proto`` (the protocol's own message definitions), as a collector would. A live
``inturn local`` runs with the standard variables (``OTEL_TRACES_EXPORTER=otlp``,
``OTEL_EXPORTER_OTLP_ENDPOINT``) and delivers to an HTTP receiver (which accepts) and an MLLP
receiver (which answers AE until the message is marked failed).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from inturn.worker import tracing
from inturn.worker.testing import HttpReceiver, MllpReceiver
from tests.support.local import (
    HOST,
    INTURN,
    LocalProcess,
    accepting_and_refusing,
    free_port,
    manifest,
    message,
    send,
)


@dataclass
class Span:
    """One exported span, flattened."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    error: bool
    service: str
    start_ns: int
    end_ns: int


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)


class OtlpReceiver:
    """An OTLP/HTTP trace endpoint (``POST /v1/traces``, ``application/x-protobuf``)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _export(self, request: web.Request) -> web.Response:
        body = ExportTraceServiceRequest.FromString(await request.read())
        self.requests += 1
        for rs in body.resource_spans:
            res = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            error=s.status.code == 2,
                            service=str(res.get("service.name")),
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    async def __aenter__(self) -> OtlpReceiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    def named(self, name: str, **attrs: Any) -> list[Span]:
        return [
            s
            for s in self.spans
            if s.name == name and all(s.attributes.get(k) == v for k, v in attrs.items())
        ]


@pytest.fixture
async def otlp() -> AsyncIterator[OtlpReceiver]:
    async with OtlpReceiver() as receiver:
        yield receiver


N = 3


def sampled(traceparent: str) -> str:
    """A W3C ``traceparent`` without its flags, which must say "sampled" (bit 0; bit 1, "random
    trace id", is Trace Context level 2's and the SDK may set it)."""
    version_trace_span, _, flags = traceparent.rpartition("-")
    assert int(flags, 16) & 1, traceparent
    return version_trace_span


@pytest.mark.acceptance  # a live inturn local
async def test_a_trace_per_message_from_ingest_to_each_receiver(
    fresh_db: str, tmp_path: Path, otlp: OtlpReceiver
) -> None:
    async with HttpReceiver() as http, MllpReceiver(ack_code="AE") as refusing:
        listen = free_port()
        args = accepting_and_refusing(tmp_path, f"{http.url}hl7", refusing.port)
        env = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{HOST}:{otlp.port}",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        local = LocalProcess(
            tmp_path / "local.log", [*args, "--listen", f"adt={listen}", "--dsn", fresh_db], env
        )
        try:
            await local.start(listen)
            assert await send(listen, [message(n) for n in range(N)]) == ["AA"] * N
            async with asyncio.timeout(90):  # every message delivered once and failed once
                while (
                    len(otlp.named("inturn.delivered")) < N or len(otlp.named("inturn.failed")) < N
                ):
                    await asyncio.sleep(0.2)
            assert await local.interrupt() == 0
        finally:
            await local.kill()
        log = local.log()
        headers = list(http.headers)
        peer = f"{http.url}hl7"
        payloads = list(http.received)

    assert "tracing on: otlp exporter, service inturn-local" in log
    assert {s.service for s in otlp.spans} == {"inturn-local"}
    with psycopg.connect(fresh_db) as conn:
        stored = dict(
            conn.execute(
                "SELECT control_id || ' ' || destination, traceparent FROM inturn_delivery"
            ).fetchall()
        )
    for n in range(N):
        control_id = f"M{n:05d}"
        (receive,) = otlp.named("inturn.receive", **{"hl7.control_id": control_id})
        assert receive.attributes == {
            "inturn.channel": "adt",
            "hl7.control_id": control_id,
            "hl7.message_type": "ADT^A01",
            "inturn.ack_code": "AA",
        }
        trace = receive.trace_id
        in_trace = [s for s in otlp.spans if s.trace_id == trace]
        # stored: one store span under the receive span, its duration the store latency
        (store,) = [s for s in in_trace if s.name == "inturn.store"]
        assert store.parent_id == receive.span_id
        assert store.attributes == {
            "inturn.destinations": ["default/to-http", "default/to-mllp"],
            "inturn.stored": True,
        }
        assert receive.start_ns <= store.start_ns <= store.end_ns <= receive.end_ns
        # the row carries the receive span's context to the worker
        for dest in ("default/to-http", "default/to-mllp"):
            assert sampled(stored[f"{control_id} {dest}"]) == f"00-{trace}-{receive.span_id}"
        # HTTP: one attempt, delivered; the receiver got that attempt's traceparent
        (attempt,) = [
            s
            for s in in_trace
            if s.name == "inturn.attempt"
            and s.attributes["inturn.destination"] == "default/to-http"
        ]
        assert attempt.parent_id == receive.span_id and not attempt.error
        assert attempt.attributes["inturn.outcome"] == "delivered"
        assert attempt.attributes["inturn.attempt"] == 1
        assert attempt.attributes["hl7.control_id"] == control_id
        assert attempt.attributes["inturn.peer"] == peer
        index = next(i for i, p in enumerate(payloads) if control_id.encode() in p)
        assert sampled(headers[index]["traceparent"]) == f"00-{trace}-{attempt.span_id}"
        (delivered,) = [s for s in in_trace if s.name == "inturn.delivered"]
        assert delivered.attributes == {
            "inturn.destination": "default/to-http",
            "inturn.attempts": 1,
        }
        assert delivered.parent_id == receive.span_id
        # MLLP: two refused attempts (AE), then failed
        refused = sorted(
            (
                s
                for s in in_trace
                if s.name == "inturn.attempt"
                and s.attributes["inturn.destination"] == "default/to-mllp"
            ),
            key=lambda s: s.attributes["inturn.attempt"],
        )
        assert [s.attributes["inturn.attempt"] for s in refused] == [1, 2]
        assert all(s.error and s.attributes["inturn.outcome"] == "AE" for s in refused)
        assert all(s.parent_id == receive.span_id for s in refused)
        (failed,) = [s for s in in_trace if s.name == "inturn.failed"]
        assert failed.attributes == {"inturn.destination": "default/to-mllp", "inturn.attempts": 2}

    # no payload, patient identifier or name in any attribute
    for span in otlp.spans:
        for value in span.attributes.values():
            text = str(value)
            assert "Testperson" not in text and "PID" not in text and "P0000" not in text, span


@pytest.mark.acceptance  # a live inturn local
async def test_off_without_the_variables_nothing_is_stored_or_exported(
    fresh_db: str, tmp_path: Path, otlp: OtlpReceiver
) -> None:
    async with HttpReceiver() as http:
        listen = free_port()
        f = manifest(tmp_path / "http.yaml", "to-http", f"{{http: {{url: '{http.url}hl7'}}}}")
        local = LocalProcess(
            tmp_path / "local.log", ["-f", str(f), "--listen", f"adt={listen}", "--dsn", fresh_db]
        )
        try:
            await local.start(listen)
            assert await send(listen, [message(1)]) == ["AA"]
            async with asyncio.timeout(30):
                while not http.received:
                    await asyncio.sleep(0.1)
            assert await local.interrupt() == 0
        finally:
            await local.kill()
        assert "traceparent" not in {k.lower() for k in http.headers[0]}
    assert "tracing on" not in local.log()
    assert otlp.requests == 0
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT traceparent FROM inturn_delivery").fetchall() == [(None,)]


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_SERVICE_NAME": "ingest"}, False),
    ],
)
def test_tracing_is_on_only_when_the_variables_ask(env: dict[str, str], wanted: bool) -> None:
    assert tracing.wanted(env) is wanted


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin'"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "OTEL_TRACES_EXPORTER='otlp,console'"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'",
        ),
    ],
)
def test_an_exporter_inturn_lacks_is_a_clear_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(tracing.TracingError, match=message.replace("/", ".")):
        tracing.configure("inturn-test", env)
    assert not tracing.enabled()


def test_hooks_are_no_ops_when_off() -> None:
    assert not tracing.enabled()
    tracing.received("adt", 0.0)
    assert tracing.traceparent() is None
    tracing.stored(["a/b"], 0.0, True)
    tracing.answered("AA", "X", "ADT^A01")
    attempt = tracing.attempt_started("a/b", 1, "X", None, 1, "mllp x:1")
    assert attempt is None
    headers: dict[str, str] = {}
    tracing.inject(headers)
    tracing.attempt_ended(attempt, None)
    tracing.finished(attempt, "delivered", 1)
    assert headers == {}


@pytest.mark.parametrize("command", ["ingest", "worker"])
def test_ingest_and_worker_refuse_an_exporter_they_lack_at_start(
    command: str, tmp_path: Path
) -> None:
    """Both processes read the variables before anything else (no database is reached)."""
    f = manifest(tmp_path / "d.yaml", "to-http", "{http: {url: 'http://127.0.0.1:9/hl7'}}")
    args = {
        "ingest": ["--listen", f"adt={free_port()}"],
        "worker": ["-f", str(f), "--http-port", "0"],
    }[command]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_TRACES_EXPORTER"] = "zipkin"
    done = subprocess.run(
        [str(INTURN), command, *args, "--dsn", "postgresql://nobody@127.0.0.1:1/none"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "OTEL_TRACES_EXPORTER='zipkin'" in lines[0], done.stderr
