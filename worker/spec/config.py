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

from inturn.worker.hl7.filter import FieldCondition, conditions_of
from inturn.worker.hl7.profile import Profile, compile_profile
from inturn.worker.senders import registry as senders
from inturn.worker.senders.kind import SenderConfig
from inturn.worker.spec.replies import ReplyRule, rules_of
from inturn.worker.spec.replies import to_spec as reply_spec
from inturn.worker.spec.schedule import Schedule, parse, to_spec
from inturn.worker.spec.schema_packs import pack_spec_of

AckAction = Literal["retry", "fail"]
#: ``retry.unreachable``: hold the queue without counting attempts, or count them (the old way).
UnreachableAction = Literal["hold", "count"]

DEFAULT_BACKOFF_SECONDS = 5
DEFAULT_MAX_BACKOFF_SECONDS = 60
DEFAULT_TIMEOUT_SECONDS = 30
DEFAULT_IDLE_SECONDS = 60
#: Default of ``spec.alerting.stuckAfterSeconds``: the head may wait 15 minutes.
DEFAULT_STUCK_AFTER_SECONDS = 900
#: Default of ``spec.lanes.window``: the lanes look over the 10,000 oldest pending messages.
DEFAULT_LANES_WINDOW = 10_000


@dataclass(frozen=True)
class RetryPolicy:
    """How hard a head is retried.

    Attributes:
        max_attempts: attempts before the item is marked failed; 0 means forever.
        backoff_seconds: the first delay after a failure; it doubles per attempt.
        max_backoff_seconds: the ceiling of the delay.
        timeout_seconds: the bound of one attempt (connect, send and wait for the ACK).
        unreachable: ``hold`` (default): a failure that says the destination is unreachable
            (nothing about the message was heard) holds the queue without counting towards
            ``max_attempts``; ``count``: it counts like any failure.
    """

    max_attempts: int
    backoff_seconds: int = DEFAULT_BACKOFF_SECONDS
    max_backoff_seconds: int = DEFAULT_MAX_BACKOFF_SECONDS
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    unreachable: UnreachableAction = "hold"


@dataclass(frozen=True)
class AckPolicy:
    """Per negative outcome, whether the head is retried or given up at once (``fail``).

    The default retries everything that a later attempt could fix, so that order is never broken
    silently. ``unsendable`` (a stored message its sender can never send) and ``profile`` (a
    message the destination's receiver profile refuses: a character with no place in the target
    charset under ``unmappable: refuse``, bytes that do not decode as its MSH-18 says, a map's
    ``otherwise: hold``, no usable MSH) are refused the same way at every attempt; left unset
    (None) they follow ``retry.maxAttempts`` (:meth:`action`): above 0, the destination lets
    messages leave the stream, and such a message fails at once (no later attempt can change
    it) onto the failed list for a person; 0 ("never let one go", guarantees page) keeps it at
    the head, raised as stuck, until a person corrects the profile or skips it, so that a
    discharge never overtakes an admission its profile refused. Set, they apply whatever
    ``maxAttempts`` says.
    """

    AE: AckAction = "retry"
    AR: AckAction = "retry"
    CE: AckAction = "retry"
    CR: AckAction = "retry"
    invalidAck: AckAction = "retry"
    controlIdMismatch: AckAction = "retry"
    unsendable: AckAction | None = None
    profile: AckAction | None = None

    def action(self, outcome: str, max_attempts: int = 0) -> AckAction:
        """Return ``retry`` or ``fail`` for a sender outcome; transport outcomes always retry.
        ``max_attempts`` (the destination's ``retry.maxAttempts``) decides an unset
        ``unsendable`` or ``profile``: ``fail`` above 0, ``retry`` at 0 (for ever)."""
        value = getattr(self, outcome, "retry")
        if value is None:
            return "fail" if max_attempts > 0 else "retry"
        return "fail" if value == "fail" else "retry"


@dataclass(frozen=True)
class WorkerConfig:
    """Everything one worker needs.

    Attributes:
        destination: ``namespace/name`` of the Destination; the queue key.
        channel: the ingest channel feeding it.
        sender: where and how to deliver (the configuration of one sender kind, see
            :mod:`inturn.worker.senders.registry`).
        retry: the retry policy.
        ack_policy: per negative outcome, retry or fail.
        idle_seconds: the safety poll: how often an idle worker looks at its queue when no
            notification wakes it (seconds).
        suspend: hold the lock and send nothing.
        message_types: MSH-9 patterns the destination accepts (routing, used by ingest).
        field_conditions: conditions on HL7 fields a message must meet as well
            (``spec.filter.fields``; routing, used by ingest).
        carriers: IATA airline designators this destination serves (reservation notices).
        stuck_after_seconds: how long the head may wait before the sweeper raises the
            destination as stuck (``spec.alerting.stuckAfterSeconds``).
        expire_after_seconds: pending messages older than this are skipped as expired by the
            sweeper (``spec.expireAfterSeconds``); None (the default) never expires them.
        schedule: when messages may be sent (``spec.schedule``); None: at any time.
        messages_per_second: the throttle (``spec.throttle.messagesPerSecond``); None: none.
        replies: the replies its orders expect (``spec.replies``).
        lanes: messages in flight at once (``spec.lanes.count``, 1 to 32); 1 is the single
            stream (:mod:`inturn.worker.drain.stream`), more the lanes
            (:mod:`inturn.worker.drain.lane_runner`).
        lanes_window: how many of the oldest pending messages the lanes look over
            (``spec.lanes.window``).
        profile: what the receiver gets when it is not the message as stored (``spec.profile``,
            compiled: :mod:`inturn.worker.hl7.profile`); None: the stored bytes.
        pack_spec: the other fields of the installed packs (:class:`~.schema_packs.SpecField`
            with ``worker``) as the spec writes them, by name: what a pack of another
            distribution reads of its Destination (``replies`` and ``carriers`` have their
            own attributes above and are not repeated here).
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
    field_conditions: tuple[FieldCondition, ...] = ()
    stuck_after_seconds: int = DEFAULT_STUCK_AFTER_SECONDS
    expire_after_seconds: int | None = None
    schedule: Schedule | None = None
    messages_per_second: int | None = None
    replies: tuple[ReplyRule, ...] = ()
    lanes: int = 1
    lanes_window: int = DEFAULT_LANES_WINDOW
    profile: Profile | None = None
    pack_spec: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def body_charset(self) -> str | None:
        """The charset (IANA name, e.g. ``ISO-8859-1``) every message is sent in when the
        profile converts it (``spec.profile.charset``); None when it does not (the message
        goes in the charset it was stored in)."""
        if self.profile is None or self.profile.charset is None:
            return None
        return self.profile.charset.mime


# --- the rendered form (JSON) -----------------------------------------------------------------
#
# ``to_dict``/``from_dict`` convert between the model and the camelCase JSON the operator writes
# into the worker's ConfigMap. They do not validate: ``inturn.worker.spec.destination``
# validates the JSON against its schema before calling ``from_dict``.


def to_dict(cfg: WorkerConfig) -> dict[str, Any]:
    """Return ``cfg`` as the camelCase JSON object of a rendered worker configuration.

    The inverse of :func:`from_dict`: ``from_dict(to_dict(cfg)) == cfg``.
    """
    ack = cfg.ack_policy
    return {
        "destination": cfg.destination,
        "channel": cfg.channel,
        "messageTypes": list(cfg.message_types),
        **(
            {"filterFields": [c.to_spec() for c in cfg.field_conditions]}
            if cfg.field_conditions
            else {}
        ),
        "carriers": list(cfg.carriers),
        "sender": senders.to_dict(cfg.sender),
        "retry": {
            "maxAttempts": cfg.retry.max_attempts,
            "backoffSeconds": cfg.retry.backoff_seconds,
            "maxBackoffSeconds": cfg.retry.max_backoff_seconds,
            "timeoutSeconds": cfg.retry.timeout_seconds,
            "unreachable": cfg.retry.unreachable,
        },
        "ackPolicy": {
            "AE": ack.AE,
            "AR": ack.AR,
            "CE": ack.CE,
            "CR": ack.CR,
            "invalidAck": ack.invalidAck,
            "controlIdMismatch": ack.controlIdMismatch,
            **({"unsendable": ack.unsendable} if ack.unsendable is not None else {}),
            **({"profile": ack.profile} if ack.profile is not None else {}),
        },
        "idleSeconds": cfg.idle_seconds,
        "suspend": cfg.suspend,
        "alerting": {"stuckAfterSeconds": cfg.stuck_after_seconds},
        **(
            {"expireAfterSeconds": cfg.expire_after_seconds}
            if cfg.expire_after_seconds is not None
            else {}
        ),
        **({"schedule": to_spec(cfg.schedule)} if cfg.schedule is not None else {}),
        **(
            {"throttle": {"messagesPerSecond": cfg.messages_per_second}}
            if cfg.messages_per_second is not None
            else {}
        ),
        **({"replies": [reply_spec(r) for r in cfg.replies]} if cfg.replies else {}),
        **(
            {"lanes": {"count": cfg.lanes, "key": "patient", "window": cfg.lanes_window}}
            if cfg.lanes != 1 or cfg.lanes_window != DEFAULT_LANES_WINDOW
            else {}
        ),
        **({"profile": cfg.profile.to_spec()} if cfg.profile is not None else {}),
        **dict(cfg.pack_spec),
    }


def from_dict(doc: Mapping[str, Any]) -> WorkerConfig:
    """Build a :class:`WorkerConfig` from the camelCase JSON written by :func:`to_dict`.

    Absent optional keys take the model's defaults. The document is trusted to be valid (see
    ``inturn.worker.spec.destination.load_worker_config`` for the validating entry point).

    Raises:
        KeyError, TypeError: a required key is missing or has the wrong shape.
        ValueError: a ``filterFields`` item is not a condition.
        inturn.worker.spec.schedule.ScheduleError: ``schedule`` names an unknown time zone.
        inturn.worker.hl7.profile.ProfileError: ``profile`` cannot be applied.
    """
    r = doc["retry"]
    ack = doc.get("ackPolicy", {})
    return WorkerConfig(
        destination=doc["destination"],
        channel=doc["channel"],
        sender=senders.from_dict(doc["sender"]),
        retry=RetryPolicy(
            max_attempts=int(r["maxAttempts"]),
            backoff_seconds=int(r.get("backoffSeconds", DEFAULT_BACKOFF_SECONDS)),
            max_backoff_seconds=int(r.get("maxBackoffSeconds", DEFAULT_MAX_BACKOFF_SECONDS)),
            timeout_seconds=int(r.get("timeoutSeconds", DEFAULT_TIMEOUT_SECONDS)),
            unreachable="count" if r.get("unreachable") == "count" else "hold",
        ),
        ack_policy=AckPolicy(**{k: ack[k] for k in _ACK_KEYS if k in ack}),
        idle_seconds=int(doc.get("idleSeconds", DEFAULT_IDLE_SECONDS)),
        suspend=bool(doc.get("suspend", False)),
        message_types=tuple(doc.get("messageTypes", ())),
        field_conditions=conditions_of(doc.get("filterFields")),
        carriers=tuple(doc.get("carriers", ())),
        stuck_after_seconds=int(
            (doc.get("alerting") or {}).get("stuckAfterSeconds", DEFAULT_STUCK_AFTER_SECONDS)
        ),
        expire_after_seconds=(
            None if doc.get("expireAfterSeconds") is None else int(doc["expireAfterSeconds"])
        ),
        schedule=None if doc.get("schedule") is None else parse(doc["schedule"]),
        messages_per_second=(
            None if doc.get("throttle") is None else int(doc["throttle"]["messagesPerSecond"])
        ),
        replies=rules_of(doc.get("replies")),
        lanes=int((doc.get("lanes") or {}).get("count", 1)),
        lanes_window=int((doc.get("lanes") or {}).get("window", DEFAULT_LANES_WINDOW)),
        profile=compile_profile(doc.get("profile")),
        pack_spec=pack_spec_of(doc),
    )


_ACK_KEYS = ("AE", "AR", "CE", "CR", "invalidAck", "controlIdMismatch", "unsendable", "profile")


# --- the destination lease (a process setting, not part of a Destination) ---------------------

#: Default lease lifetime, seconds: longer than the default attempt timeout
#: (:data:`DEFAULT_TIMEOUT_SECONDS`), since an attempt starts only while the lease outlives it.
DEFAULT_LEASE_TTL_SECONDS = 45.0
#: Default renewal interval of an idle holder, seconds (a third of the lifetime).
DEFAULT_LEASE_RENEW_SECONDS = 15.0
#: Default interval of a standby's tries to take the lease, seconds.
DEFAULT_LEASE_ACQUIRE_SECONDS = 5.0
#: Seconds an attempt's lease must outlive its timeout by, at least (the statement that
#: renewed it and the mark after the attempt).
LEASE_MARGIN_SECONDS = 5.0
#: Environment variables of the lease settings (the chart sets them from ``worker.lease``).
LEASE_ENV = {
    "ttl_seconds": "INTURN_LEASE_TTL_SECONDS",
    "renew_seconds": "INTURN_LEASE_RENEW_SECONDS",
    "acquire_seconds": "INTURN_LEASE_ACQUIRE_SECONDS",
}


class LeaseSettingsError(ValueError):
    """Lease settings that cannot work (the message names the setting)."""


@dataclass(frozen=True)
class LeaseSettings:
    """How a worker holds its destination's lease (:mod:`inturn.worker.store.lease`).

    Attributes:
        ttl_seconds: the lease's lifetime; the worker renews it every ``renew_seconds`` (its
            per-message statements renew it once that is due, and check it in between).
        renew_seconds: the longest a holder goes without renewing (< ``ttl_seconds``).
        acquire_seconds: how often a standby tries to take the lease.
    """

    ttl_seconds: float = DEFAULT_LEASE_TTL_SECONDS
    renew_seconds: float = DEFAULT_LEASE_RENEW_SECONDS
    acquire_seconds: float = DEFAULT_LEASE_ACQUIRE_SECONDS

    def __post_init__(self) -> None:
        for name in ("ttl_seconds", "renew_seconds", "acquire_seconds"):
            if not getattr(self, name) > 0:
                raise LeaseSettingsError(f"{LEASE_ENV[name]} must be > 0 seconds")
        if self.renew_seconds >= self.ttl_seconds:
            raise LeaseSettingsError(
                f"{LEASE_ENV['renew_seconds']} ({self.renew_seconds:g}) must be shorter than"
                f" {LEASE_ENV['ttl_seconds']} ({self.ttl_seconds:g})"
            )

    def for_timeout(self, timeout_seconds: float) -> LeaseSettings:
        """These settings with a lifetime long enough for attempts of ``timeout_seconds``: an
        attempt starts only while the lease outlives its timeout, so the lifetime is raised to
        ``timeout_seconds`` + :data:`LEASE_MARGIN_SECONDS` when it is shorter."""
        needed = float(timeout_seconds) + LEASE_MARGIN_SECONDS
        if self.ttl_seconds >= needed:
            return self
        return LeaseSettings(needed, self.renew_seconds, self.acquire_seconds)

    def takeover_bound_seconds(self) -> float:
        """The longest a destination waits for a new holder after its holder died or was cut
        off: the lease's lifetime (it was renewed at most then) plus a standby's interval."""
        return self.ttl_seconds + self.acquire_seconds


def lease_settings(environ: Mapping[str, str]) -> LeaseSettings:
    """The lease settings of the ``INTURN_LEASE_*`` variables (:data:`LEASE_ENV`), defaults for
    the ones not set.

    Raises:
        LeaseSettingsError: a value is not a number, not positive, or renewal is not shorter
            than the lifetime.
    """
    values: dict[str, float] = {}
    for name, var in LEASE_ENV.items():
        text = environ.get(var, "").strip()
        if not text:
            continue
        try:
            values[name] = float(text)
        except ValueError:
            raise LeaseSettingsError(f"{var} must be a number of seconds, not {text!r}") from None
    return LeaseSettings(**values)


# --- wake-ups behind a pooler (process settings) ---------------------------------------------

#: A direct DSN for LISTEN when the worker's DSN goes through a pooler (``--listen-dsn``).
LISTEN_DSN_ENV = "INTURN_LISTEN_DSN"
#: How often a pooled worker without a LISTEN connection looks for work (``INTURN_POLL_SECONDS``).
POLL_SECONDS_ENV = "INTURN_POLL_SECONDS"
DEFAULT_POLL_SECONDS = 1.0


def poll_seconds(environ: Mapping[str, str]) -> float:
    """The poll interval of :data:`POLL_SECONDS_ENV`, or :data:`DEFAULT_POLL_SECONDS`.

    Raises:
        LeaseSettingsError: the value is not a positive number.
    """
    text = environ.get(POLL_SECONDS_ENV, "").strip()
    if not text:
        return DEFAULT_POLL_SECONDS
    try:
        value = float(text)
    except ValueError:
        raise LeaseSettingsError(
            f"{POLL_SECONDS_ENV} must be a number of seconds, not {text!r}"
        ) from None
    if not value > 0:
        raise LeaseSettingsError(f"{POLL_SECONDS_ENV} must be > 0 seconds")
    return value
