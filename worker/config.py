"""The worker's configuration model: what one worker needs to drain one destination.

Pure data, no I/O. The operator renders it into a ConfigMap (JSON); ``inturn worker --config``
reads it back; ``inturn worker -f`` and ``inturn local`` build it from a Destination manifest.
Field names follow the Destination's ``spec`` (camelCase in JSON/YAML). Durations are integer
seconds, as the Kubernetes API conventions ask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

AckAction = Literal["retry", "fail"]

DEFAULT_BACKOFF_SECONDS = 5
DEFAULT_MAX_BACKOFF_SECONDS = 60
DEFAULT_TIMEOUT_SECONDS = 30
DEFAULT_IDLE_SECONDS = 2


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
    """An MLLP receiver: host, port (1-65535), optional TLS, maximum ACK size in bytes."""

    host: str
    port: int
    tls: TlsConfig | None = None
    max_ack_bytes: int = 1024 * 1024


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
        idle_seconds: poll interval when nothing wakes the worker.
        suspend: hold the lock and send nothing.
        message_types: MSH-9 patterns the destination accepts (routing, used by ingest).
    """

    destination: str
    channel: str
    sender: SenderConfig
    retry: RetryPolicy
    ack_policy: AckPolicy = field(default_factory=AckPolicy)
    idle_seconds: int = DEFAULT_IDLE_SECONDS
    suspend: bool = False
    message_types: tuple[str, ...] = ()
