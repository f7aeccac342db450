"""OpenTelemetry traces of each message, when the standard ``OTEL_*`` variables ask for them.

Off by default. :func:`configure` switches tracing on for the process when
``OTEL_TRACES_EXPORTER`` names an exporter (``otlp`` or ``console``; ``none`` keeps it off) or
an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), unless ``OTEL_SDK_DISABLED=true``. The exporter then
reads its own settings from the environment (endpoint, headers, timeout, compression; batching
from ``OTEL_BSP_*``), as the OpenTelemetry specification defines them ("Environment Variable
Specification", "OTLP Exporter Configuration"). ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or the
``_TRACES_`` one) chooses ``http/protobuf`` (the default, as the specification recommends) or
``grpc`` (needs ``opentelemetry-exporter-otlp-proto-grpc``). The libraries come with the
``tracing`` extra (``pip install 'inturn[tracing]'``); asked for without them, the process logs
one warning and runs untraced.

A message's trace, one span each (all times wall clock):

* ``inturn.receive`` (ingest, kind SERVER): from the complete frame (or HTTP body) to the
  answer; attributes ``inturn.channel``, ``hl7.control_id`` (MSH-10), ``hl7.message_type``
  (MSH-9), ``inturn.ack_code`` (MSA-1 of the answer).
* ``inturn.store`` (its child): waiting for and running the transaction that stores the rows;
  attributes ``inturn.destinations`` and ``inturn.stored`` (false when nothing was kept). Its
  duration is the store latency.
* ``inturn.attempt`` (worker, kind CLIENT), one per attempt, child of the message's trace:
  ``inturn.destination``, ``inturn.item_id``, ``inturn.attempt`` (1 for the first),
  ``inturn.peer`` (the sender's credential-free summary), ``inturn.outcome`` (``delivered`` or
  the failure cause class); status ERROR when the attempt failed. Its duration is the attempt's.
* ``inturn.delivered`` or ``inturn.failed`` (worker): the message's end at that destination,
  with ``inturn.attempts``.

The trace context goes from ingest to the worker with the row: ingest stores the receive span's
W3C ``traceparent`` (W3C Trace Context, section 3.2) in ``inturn_delivery.traceparent`` and the
worker parents its spans on it. The HTTP sender passes the attempt's context to the receiver
as a ``traceparent`` header (:func:`inject`). Payloads, patient identifiers and error details
never become attributes: only channel and destination names, MSH-9, MSH-10, ids, counts, ACK
codes and cause classes do.

Cost when off: each hook is one call that finds :data:`_tracer` unset and returns; nothing of
OpenTelemetry is imported (``bench/delivery.py`` prints the rate with and without).
"""

from __future__ import annotations

import contextvars
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inturn.worker.errors import Invalid

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("inturn.tracing")

#: The exporters :func:`configure` knows, by ``OTEL_TRACES_EXPORTER`` value.
EXPORTERS = ("otlp", "console")

_provider: TracerProvider | None = None
_tracer: Tracer | None = None
#: The message being received in this task (ingest), or the attempt in flight (worker).
_current: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
    "inturn_trace_span", default=None
)


class TracingError(Invalid):
    """The ``OTEL_*`` settings ask for something this process cannot do (an unknown exporter
    or protocol)."""


def wanted(env: dict[str, str] | None = None) -> bool:
    """Whether the environment asks for traces (see the module's description)."""
    env = dict(os.environ) if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def enabled() -> bool:
    """Whether this process exports traces."""
    return _tracer is not None


def configure(service_name: str, env: dict[str, str] | None = None) -> bool:
    """Switch tracing on when the environment asks for it; return whether it is on.

    Args:
        service_name: ``service.name`` of the traces unless ``OTEL_SERVICE_NAME`` is set
            (``inturn-ingest``, ``inturn-worker``, ``inturn-local``).
        env: the environment to read (default ``os.environ``; the exporter itself always
            reads ``os.environ``).

    Raises:
        TracingError: ``OTEL_TRACES_EXPORTER`` names more than one or an unknown exporter, or
            the OTLP protocol is neither ``http/protobuf`` nor ``grpc``.
    """
    global _provider, _tracer
    env = dict(os.environ) if env is None else env
    if not wanted(env):
        return False
    name = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if name not in EXPORTERS:
        raise TracingError(
            f"OTEL_TRACES_EXPORTER={name!r}: inturn exports traces with one of"
            f" {', '.join(EXPORTERS)} (or none)"
        )
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_* variables ask for traces but OpenTelemetry is not installed"
            " (pip install 'inturn[tracing]'): running without traces"
        )
        return False
    exporter = _exporter(name, env)
    shutdown()
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _provider = provider
    _tracer = provider.get_tracer("inturn")
    log.info("tracing on: %s exporter, service %s", name, resource.attributes["service.name"])
    return True


def _exporter(name: str, env: dict[str, str]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            raise TracingError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc"
                " (or use http/protobuf)"
            ) from None
        return GrpcExporter()
    raise TracingError(
        f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: inturn speaks http/protobuf or grpc"
    )


def shutdown() -> None:
    """Export what is buffered and switch tracing off (a no-op when off)."""
    global _provider, _tracer
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def _wall_ns(perf: float) -> int:
    """A ``time.perf_counter()`` reading as wall-clock nanoseconds since the epoch."""
    return time.time_ns() - int((time.perf_counter() - perf) * 1e9)


# --- ingest ------------------------------------------------------------------------------------


def received(channel: str, received_at: float) -> None:
    """A complete message arrived on ``channel`` at ``received_at`` (``time.perf_counter()``):
    start its ``inturn.receive`` span, current in this task until :func:`answered`."""
    if _tracer is None:
        return
    from opentelemetry.trace import SpanKind

    span = _tracer.start_span(
        "inturn.receive",
        kind=SpanKind.SERVER,
        start_time=_wall_ns(received_at),
        attributes={"inturn.channel": channel},
    )
    _current.set(span)


def traceparent() -> str | None:
    """The W3C ``traceparent`` of the message being received in this task, or None."""
    span = _current.get() if _tracer is not None else None
    if span is None:
        return None
    carrier: dict[str, str] = {}
    _inject(carrier, span)
    return carrier.get("traceparent")


def stored(destinations: tuple[str, ...] | list[str], began: float, ok: bool) -> None:
    """The message's rows were stored (``ok``) or not, in a transaction that began (waiting for
    its connection included) at ``began`` (``time.perf_counter()``)."""
    if _tracer is None:
        return
    parent = _current.get()
    if parent is None:
        return
    from opentelemetry.trace import StatusCode, set_span_in_context

    span = _tracer.start_span(
        "inturn.store",
        context=set_span_in_context(parent),
        start_time=_wall_ns(began),
        attributes={"inturn.destinations": list(destinations), "inturn.stored": ok},
    )
    if not ok:
        span.set_status(StatusCode.ERROR, "not stored")
    span.end()


def answered(code: str, control_id: str | None, message_type: str | None) -> None:
    """Ingest answered the message being received with MSA-1 ``code``: end its span."""
    if _tracer is None:
        return
    span = _current.get()
    if span is None:
        return
    _current.set(None)
    from opentelemetry.trace import StatusCode

    span.set_attribute("inturn.ack_code", code)
    if control_id:
        span.set_attribute("hl7.control_id", control_id)
    if message_type:
        span.set_attribute("hl7.message_type", message_type)
    if code in ("AE", "CE"):
        span.set_status(StatusCode.ERROR, code)
    span.end()


# --- worker ------------------------------------------------------------------------------------


@dataclass
class Attempt:
    """One attempt's span and what the message's end needs (see :func:`attempt_started`)."""

    span: Span
    parent: Any
    destination: str


def attempt_started(
    destination: str,
    item_id: int,
    control_id: str,
    parent_traceparent: str | None,
    attempt: int,
    peer: str,
) -> Attempt | None:
    """An attempt to send item ``item_id`` begins: start its ``inturn.attempt`` span under the
    message's stored ``traceparent`` (a trace of its own when there is none), current in this
    task for :func:`inject`. None when tracing is off."""
    if _tracer is None:
        return None
    from opentelemetry.trace import SpanKind, set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = (
        TraceContextTextMapPropagator().extract({"traceparent": parent_traceparent})
        if parent_traceparent
        else None
    )
    span = _tracer.start_span(
        "inturn.attempt",
        context=parent,
        kind=SpanKind.CLIENT,
        attributes={
            "inturn.destination": destination,
            "inturn.item_id": item_id,
            "hl7.control_id": control_id,
            "inturn.attempt": attempt,
            "inturn.peer": peer,
        },
    )
    _current.set(span)
    # the message's end hangs off the same parent as its attempts
    return Attempt(span, parent if parent is not None else set_span_in_context(span), destination)


def attempt_ended(attempt: Attempt | None, outcome: str | None) -> None:
    """The attempt ended: delivered (``outcome`` None) or failed with cause class ``outcome``."""
    if attempt is None:
        return
    from opentelemetry.trace import StatusCode

    _current.set(None)
    attempt.span.set_attribute("inturn.outcome", outcome or "delivered")
    if outcome is not None:
        attempt.span.set_status(StatusCode.ERROR, outcome)
    attempt.span.end()


def finished(attempt: Attempt | None, state: str, attempts: int) -> None:
    """The message's end at the attempt's destination: ``state`` is ``delivered`` or
    ``failed`` (marked failed), after ``attempts`` attempts."""
    if attempt is None or _tracer is None:
        return
    span = _tracer.start_span(
        f"inturn.{state}",
        context=attempt.parent,
        attributes={"inturn.destination": attempt.destination, "inturn.attempts": attempts},
    )
    span.end()


def inject(headers: dict[str, str]) -> None:
    """Add the ``traceparent`` (and ``tracestate``) of the attempt in flight to ``headers``
    (W3C Trace Context, section 3); nothing when tracing is off."""
    if _tracer is None:
        return
    span = _current.get()
    if span is not None:
        _inject(headers, span)


def _inject(carrier: dict[str, str], span: Span) -> None:
    from opentelemetry.trace import set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
