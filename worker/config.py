"""The worker's configuration model: what one worker needs to drain one destination.

Pure data, no I/O. The operator renders it into a ConfigMap (JSON); ``inturn worker --config``
reads it back; ``inturn worker -f`` and ``inturn local`` build it from a Destination manifest.
Field names follow the Destination's ``spec`` (camelCase in JSON/YAML). Durations are integer
seconds, as the Kubernetes API conventions ask.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

AckAction = Literal["retry", "fail"]

DEFAULT_BACKOFF_SECONDS = 5
DEFAULT_MAX_BACKOFF_SECONDS = 60
DEFAULT_TIMEOUT_SECONDS = 30
DEFAULT_IDLE_SECONDS = 60


@dataclass(frozen=True)
class RetryPolicy:
    """How hard a head is retried.

    Attributes:
        max_attempts: attempts before the item is marked failed; 0 means forever.
        backoff_seconds: the first delay after a failure; it doubles per attempt.
        max_backoff_seconds: the ceiling of the delay.
        timeout_seconds: the bound of one attempt (connect, send and wait for the ACK).
    """

    max_attempts: int
    backoff_seconds: int = DEFAULT_BACKOFF_SECONDS
    max_backoff_seconds: int = DEFAULT_MAX_BACKOFF_SECONDS
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS


@dataclass(frozen=True)
class AckPolicy:
    """Per negative outcome, whether the head is retried or given up at once (``fail``).

    The default retries everything, so that order is never broken silently.
    """

    AE: AckAction = "retry"
    AR: AckAction = "retry"
    CE: AckAction = "retry"
    CR: AckAction = "retry"
    invalidAck: AckAction = "retry"
    controlIdMismatch: AckAction = "retry"

    def action(self, outcome: str) -> AckAction:
        """Return ``retry`` or ``fail`` for a sender outcome; transport outcomes always retry."""
        value = getattr(self, outcome, "retry")
        return "fail" if value == "fail" else "retry"


@dataclass(frozen=True)
class TlsConfig:
    """Client TLS for a sender. Paths point at files mounted from Secrets.

    Attributes:
        ca_file: PEM bundle of trusted CAs; None uses the system store.
        cert_file, key_file: client certificate and key (both or neither).
        server_name: name to verify and send as SNI; None uses the host.
        insecure_skip_verify: turn certificate verification off (tests only).
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    insecure_skip_verify: bool = False


@dataclass(frozen=True)
class MllpSenderConfig:
    """An MLLP receiver: host, port (1-65535), optional TLS, maximum ACK size in bytes.

    ``always_wait_for_ack``: wait for one positive ACK even when the message's MSH-15/MSH-16
    ask for none (for receivers that answer every message whatever it asks for).
    """

    host: str
    port: int
    tls: TlsConfig | None = None
    max_ack_bytes: int = 1024 * 1024
    always_wait_for_ack: bool = False


@dataclass(frozen=True)
class HttpSenderConfig:
    """An HTTP receiver: the payload is POSTed to ``url``; 2xx is success.

    ``headers`` are sent with every request; ``headers_file`` optionally names a mounted Secret
    file of ``Name: value`` lines (credentials) added to them.
    """

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    headers_file: str | None = None
    tls: TlsConfig | None = None


SenderConfig = MllpSenderConfig | HttpSenderConfig


@dataclass(frozen=True)
class WorkerConfig:
    """Everything one worker needs.

    Attributes:
        destination: ``namespace/name`` of the Destination; the queue key.
        channel: the ingest channel feeding it.
        sender: where and how to deliver.
        retry: the retry policy.
        ack_policy: per negative outcome, retry or fail.
        idle_seconds: the safety poll: how often an idle worker looks at its queue when no
            notification wakes it (seconds).
        suspend: hold the lock and send nothing.
        message_types: MSH-9 patterns the destination accepts (routing, used by ingest).
        carriers: IATA airline designators this destination serves (reservation notices).
    """

    destination: str
    channel: str
    sender: SenderConfig
    retry: RetryPolicy
    ack_policy: AckPolicy = field(default_factory=AckPolicy)
    idle_seconds: int = DEFAULT_IDLE_SECONDS
    suspend: bool = False
    message_types: tuple[str, ...] = ()
    carriers: tuple[str, ...] = ()


# --- the rendered form (JSON) -----------------------------------------------------------------
#
# ``to_dict``/``from_dict`` convert between the model and the camelCase JSON the operator writes
# into the worker's ConfigMap. They do not validate: ``inturn.worker.destination`` validates the
# JSON against its schema before calling ``from_dict``.


def _tls_to_dict(tls: TlsConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"insecureSkipVerify": tls.insecure_skip_verify}
    for key, value in (
        ("caFile", tls.ca_file),
        ("certFile", tls.cert_file),
        ("keyFile", tls.key_file),
        ("serverName", tls.server_name),
    ):
        if value is not None:
            out[key] = value
    return out


def _tls_from_dict(doc: Mapping[str, Any] | None) -> TlsConfig | None:
    if doc is None:
        return None
    return TlsConfig(
        ca_file=doc.get("caFile"),
        cert_file=doc.get("certFile"),
        key_file=doc.get("keyFile"),
        server_name=doc.get("serverName"),
        insecure_skip_verify=bool(doc.get("insecureSkipVerify", False)),
    )


def to_dict(cfg: WorkerConfig) -> dict[str, Any]:
    """Return ``cfg`` as the camelCase JSON object of a rendered worker configuration.

    The inverse of :func:`from_dict`: ``from_dict(to_dict(cfg)) == cfg``.
    """
    sender: dict[str, Any]
    if isinstance(cfg.sender, MllpSenderConfig):
        mllp: dict[str, Any] = {
            "host": cfg.sender.host,
            "port": cfg.sender.port,
            "maxAckBytes": cfg.sender.max_ack_bytes,
            "alwaysWaitForAck": cfg.sender.always_wait_for_ack,
        }
        if cfg.sender.tls is not None:
            mllp["tls"] = _tls_to_dict(cfg.sender.tls)
        sender = {"mllp": mllp}
    else:
        http: dict[str, Any] = {"url": cfg.sender.url, "headers": dict(cfg.sender.headers)}
        if cfg.sender.headers_file is not None:
            http["headersFile"] = cfg.sender.headers_file
        if cfg.sender.tls is not None:
            http["tls"] = _tls_to_dict(cfg.sender.tls)
        sender = {"http": http}
    ack = cfg.ack_policy
    return {
        "destination": cfg.destination,
        "channel": cfg.channel,
        "messageTypes": list(cfg.message_types),
        "carriers": list(cfg.carriers),
        "sender": sender,
        "retry": {
            "maxAttempts": cfg.retry.max_attempts,
            "backoffSeconds": cfg.retry.backoff_seconds,
            "maxBackoffSeconds": cfg.retry.max_backoff_seconds,
            "timeoutSeconds": cfg.retry.timeout_seconds,
        },
        "ackPolicy": {
            "AE": ack.AE,
            "AR": ack.AR,
            "CE": ack.CE,
            "CR": ack.CR,
            "invalidAck": ack.invalidAck,
            "controlIdMismatch": ack.controlIdMismatch,
        },
        "idleSeconds": cfg.idle_seconds,
        "suspend": cfg.suspend,
    }


def from_dict(doc: Mapping[str, Any]) -> WorkerConfig:
    """Build a :class:`WorkerConfig` from the camelCase JSON written by :func:`to_dict`.

    Absent optional keys take the model's defaults. The document is trusted to be valid (see
    ``inturn.worker.destination.load_worker_config`` for the validating entry point).

    Raises:
        KeyError, TypeError: a required key is missing or has the wrong shape.
    """
    sender_doc = doc["sender"]
    sender: SenderConfig
    if "mllp" in sender_doc:
        m = sender_doc["mllp"]
        sender = MllpSenderConfig(
            host=m["host"],
            port=int(m["port"]),
            tls=_tls_from_dict(m.get("tls")),
            max_ack_bytes=int(m.get("maxAckBytes", 1024 * 1024)),
            always_wait_for_ack=bool(m.get("alwaysWaitForAck", False)),
        )
    else:
        h = sender_doc["http"]
        sender = HttpSenderConfig(
            url=h["url"],
            headers=dict(h.get("headers", {})),
            headers_file=h.get("headersFile"),
            tls=_tls_from_dict(h.get("tls")),
        )
    r = doc["retry"]
    ack = doc.get("ackPolicy", {})
    return WorkerConfig(
        destination=doc["destination"],
        channel=doc["channel"],
        sender=sender,
        retry=RetryPolicy(
            max_attempts=int(r["maxAttempts"]),
            backoff_seconds=int(r.get("backoffSeconds", DEFAULT_BACKOFF_SECONDS)),
            max_backoff_seconds=int(r.get("maxBackoffSeconds", DEFAULT_MAX_BACKOFF_SECONDS)),
            timeout_seconds=int(r.get("timeoutSeconds", DEFAULT_TIMEOUT_SECONDS)),
        ),
        ack_policy=AckPolicy(**{k: ack[k] for k in _ACK_KEYS if k in ack}),
        idle_seconds=int(doc.get("idleSeconds", DEFAULT_IDLE_SECONDS)),
        suspend=bool(doc.get("suspend", False)),
        message_types=tuple(doc.get("messageTypes", ())),
        carriers=tuple(doc.get("carriers", ())),
    )


_ACK_KEYS = ("AE", "AR", "CE", "CR", "invalidAck", "controlIdMismatch")
