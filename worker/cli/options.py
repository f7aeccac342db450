"""Command-line options shared by the ``inturn`` commands, declared once (click).

Every option that more than one command takes is here, with its ``INTURN_``-prefixed environment
variable: ``--dsn`` (``INTURN_DSN``), ``--log-level`` (``INTURN_LOG_LEVEL``), ``--log-json``
(``INTURN_LOG_JSON``), and the queue commands' ``--json``, ``--who``, ``--why`` and durations.
Every long-running command (worker, ingest, local, operator) takes :func:`logging_options` and
calls :func:`inturn.worker.text.logs.configure` (``ingest`` and ``local`` through
:func:`start_process`, with their traces). ``inturn ingest`` and ``inturn local`` take
:func:`serving_options` and :func:`ingest_settings_options`: each ingest option that applies
to both is declared here once (:data:`INGEST_ONLY` lists the others, and why).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from inturn.worker.errors import OptionInvalid
from inturn.worker.operations.actor import ACTIONS
from inturn.worker.text.durations import parse_duration

if TYPE_CHECKING:
    from inturn.worker.ingest.config import IngestConfig

F = TypeVar("F", bound=Callable[..., Any])

#: Log level names accepted by ``--log-level``.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def dsn_option(help: str = "Postgres connection string, libpq DSN or URI.") -> Callable[[F], F]:
    """``--dsn`` (``$INTURN_DSN``); ``help`` says what the default is for this command."""
    return click.option("--dsn", envvar="INTURN_DSN", show_envvar=True, help=help)


def payload_keys_option(
    *,
    required: bool = False,
    help: str = "Folder of master keys (one file per key ID, the newest wraps new keys): payloads"
    " are encrypted at rest. Without it payloads are stored in clear and an encrypted one"
    " is refused.",
) -> Callable[[F], F]:
    """``--payload-keys DIR`` (``$INTURN_PAYLOAD_KEYS``): the folder of master keys."""
    return click.option(
        "--payload-keys",
        envvar="INTURN_PAYLOAD_KEYS",
        show_envvar=True,
        required=required,
        type=click.Path(file_okay=False),
        default=None,
        help=help,
    )


def key_dsn_option(
    *,
    required: bool = False,
    help: str = "The key store: a Postgres database apart from the queue's (with --payload-keys).",
) -> Callable[[F], F]:
    """``--key-dsn`` (``$INTURN_KEY_DSN``): the key store's database."""
    return click.option(
        "--key-dsn", envvar="INTURN_KEY_DSN", show_envvar=True, required=required, help=help
    )


def payload_keys_options(command: F) -> F:
    """:func:`payload_keys_option` and :func:`key_dsn_option`: the master keys and the key
    store, for every command that stores or reads payloads (see
    :mod:`inturn.worker.operations.payload_keys`)."""
    return payload_keys_option()(key_dsn_option()(command))


def logging_options(command: F) -> F:
    """``--log-level`` (``$INTURN_LOG_LEVEL``) and ``--log-json`` (``$INTURN_LOG_JSON``)."""
    level = click.option(
        "--log-level",
        envvar="INTURN_LOG_LEVEL",
        show_envvar=True,
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default="INFO",
        show_default=True,
        help="Least severe level logged.",
    )
    as_json = click.option(
        "--log-json",
        envvar="INTURN_LOG_JSON",
        show_envvar=True,
        is_flag=True,
        help="One JSON object per log line (for log shippers) instead of text.",
    )
    return level(as_json(command))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
who_option = click.option("--who", required=True, help="Who decides (recorded in the audit).")


def os_user() -> str:
    """Who runs this command, as an audit trail should name them: the user who ran ``sudo``
    (``$SUDO_USER``) when run through it as root, else the operating-system user
    (:func:`getpass.getuser`: ``$LOGNAME``, ``$USER``, ... then the password database), else
    ``uid N`` when the user has no name (a container's arbitrary uid)."""
    import getpass

    if os.environ.get("SUDO_USER") and hasattr(os, "geteuid") and os.geteuid() == 0:
        return os.environ["SUDO_USER"]
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"


#: ``--who`` for actions a person may take without naming themselves (viewing a payload,
#: retrying, removing): the audit records the operating-system user (:func:`os_user`).
audit_who_option = click.option(
    "--who",
    default=os_user,
    show_default="the operating-system user",
    help="Recorded in the audit.",
)
why_option = click.option("--why", default=None, help="Why (recorded in the audit).")


def why_for(action: str) -> Callable[[F], F]:
    """``--why``, required when the action's rule says so (:data:`~inturn.worker.operations.
    actor.ACTIONS`: skip, drain, view-payload), as the console requires it."""
    if not ACTIONS[action].reason_required:
        return why_option
    return click.option("--why", required=True, help="Why (required; recorded in the audit).")


class DurationType(click.ParamType[int]):
    """A click parameter for ``90``, ``45s``, ``30m``, ``12h``, ``7d``, ``2w`` (seconds); with
    ``unit_required`` a bare number is refused with a one-line error saying to add a unit."""

    name = "duration"

    def __init__(self, *, unit_required: bool = False) -> None:
        #: Refuse a bare number (``7``): for options where seconds are an unlikely reading and
        #: a wrong one costs data (``inturn purge --older-than``).
        self.unit_required = unit_required

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Return the duration in seconds; a bad value is a one-line usage error."""
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if self.unit_required and text.isdigit():
            self.fail(
                f"{text!r} has no unit: add one, e.g. {text}d, {text}h, {text}m or {text}s",
                param,
                ctx,
            )
        try:
            return parse_duration(text)
        except ValueError as exc:
            if self.unit_required:
                self.fail(f"{text!r} is not a duration like 90s, 30m, 12h, 7d or 2w", param, ctx)
            self.fail(str(exc), param, ctx)


DURATION = DurationType()
#: A duration that must name its unit (``7d``, ``12h``, ``30m``, ``90s``; ``7`` is refused).
DURATION_WITH_UNIT = DurationType(unit_required=True)


def feeds_option(command: F) -> F:
    """``--feeds FILE``: the feed declarations (:mod:`inturn.worker.feeds.declare`)."""
    return click.option(
        "--feeds",
        "feeds_file",
        type=click.Path(dir_okay=False, exists=True),
        help="YAML file declaring feeds: channels that should be busy, how long each may stay"
        " silent (optionally per sender, within a weekly schedule); the sweeper's feed-silent"
        " rule raises a silent one. Without it, the declarations in the database stay.",
    )(command)


def load_feeds_file(path: str | None) -> tuple[Any, ...] | None:
    """The feeds declared in ``path`` (None when not given).

    Raises:
        click.BadParameter: the file is not a valid declaration (the message names the field).
    """
    if path is None:
        return None
    from inturn.worker.feeds.declare import FeedsError, load_feeds

    try:
        return tuple(load_feeds(path))
    except (FeedsError, OSError) as exc:
        raise click.BadParameter(str(exc), param_hint="--feeds") from None


def start_tracing(service_name: str) -> None:
    """Switch OpenTelemetry traces on when the ``OTEL_*`` variables ask for them
    (:func:`inturn.worker.tracing.configure`).

    Raises:
        click.ClickException: the variables ask for an exporter or protocol inturn lacks.
    """
    from inturn.worker import tracing

    try:
        tracing.configure(service_name)
    except tracing.TracingError as exc:
        raise click.ClickException(str(exc)) from None


def start_process(service_name: str, log_level: str, log_json: bool) -> None:
    """What a long-running command does first once its options are read: logging at
    ``log_level`` (JSON lines with ``log_json``, :func:`inturn.worker.text.logs.configure`),
    then traces as :func:`start_tracing` (``service_name``: ``inturn-ingest``, ...).

    Raises:
        click.ClickException: as :func:`start_tracing`.
    """
    from inturn.worker.text.logs import configure

    configure(log_level, log_json)
    start_tracing(service_name)


def option_error(exc: OptionInvalid) -> click.ClickException:
    """The one-line click error (exit 2) for a configuration's :class:`OptionInvalid`: a bad
    value of the option it names, else a usage error."""
    if exc.option:
        return click.BadParameter(str(exc), param_hint=exc.option)
    return click.UsageError(str(exc))


def serving_options(*, listen_required: bool, http_help: str) -> Callable[[F], F]:
    """The options of a process that serves ingest, declared once for ``inturn ingest`` and
    ``inturn local``: ``--listen CHANNEL=[HOST:]PORT`` (repeatable), ``--http [HOST:]PORT``
    (``http_help`` says how it is protected there), ``--ops [HOST:]PORT`` and
    ``--hold-unrouted``/``--accept-unrouted CHANNEL`` (repeatable). The command receives them
    as one keyword argument, ``serving``: a dict of
    :meth:`inturn.worker.ingest.config.IngestConfig.from_options` keywords (as
    :func:`ingest_settings_options` does; :func:`ingest_config` takes both)."""

    def apply(command: F) -> F:
        @functools.wraps(command)
        def collect(*args: Any, **kwargs: Any) -> Any:
            serving = {name: kwargs.pop(name) for name in SERVING}
            return command(*args, serving=serving, **kwargs)

        wrapped: Any = collect
        for option in reversed(
            (
                click.option(
                    "--listen",
                    "listen",
                    multiple=True,
                    required=listen_required,
                    metavar="CHANNEL=[HOST:]PORT",
                    help="An MLLP listener for CHANNEL (repeatable; one per channel).",
                ),
                click.option(
                    "--http",
                    "http",
                    metavar="[HOST:]PORT",
                    help=f"HTTP messages (POST /channels/CHANNEL/messages), {http_help}.",
                ),
                click.option(
                    "--ops",
                    "ops",
                    metavar="[HOST:]PORT",
                    help="/healthz, /readyz and /metrics (own port, unauthenticated; host"
                    " 127.0.0.1 unless given, 0.0.0.0 for every interface).",
                ),
                click.option(
                    "--hold-unrouted",
                    multiple=True,
                    metavar="CHANNEL",
                    help="Accept and hold (in _unrouted/CHANNEL) messages no destination takes,"
                    " instead of answering AR (repeatable).",
                ),
                click.option(
                    "--accept-unrouted",
                    multiple=True,
                    metavar="CHANNEL",
                    help="Answer AA to messages no destination takes and drop them, counted in"
                    " inturn_ingest_unrouted_total (Mirth's FILTERED), instead of answering AR"
                    " (repeatable).",
                ),
            )
        ):
            wrapped = option(wrapped)
        return wrapped  # type: ignore[no-any-return]

    return apply


#: The ``IngestConfig.from_options`` keywords :func:`serving_options` collects.
SERVING = ("listen", "http", "ops", "hold_unrouted", "accept_unrouted")


def ingest_config(
    serving: dict[str, Any], settings: dict[str, Any], **options: Any
) -> IngestConfig:
    """Ingest's configuration from what :func:`serving_options` (``serving``) and
    :func:`ingest_settings_options` (``settings``) collected and the command's own
    ``options`` (:meth:`inturn.worker.ingest.config.IngestConfig.from_options` keywords all).

    Raises:
        click.ClickException: a value is invalid (:func:`option_error`: one line, exit 2).
    """
    from inturn.worker.ingest.config import IngestConfig

    try:
        return IngestConfig.from_options(**serving, **settings, **options)
    except OptionInvalid as exc:
        raise option_error(exc) from None


#: The ``inturn ingest`` options ``inturn local`` does not take, and why: local's HTTP ingest
#: and listeners are open by design (a laptop, no TLS, no credentials; its log says so), and it
#: sizes its one pool for every component of the process against one server.
INGEST_ONLY: dict[str, str] = {
    "allow_network": "local accepts every MLLP peer (no network allow-list)",
    "allow_subject": "local has no TLS, so no client certificates",
    "http_credentials": "local's HTTP ingest is open (no authentication)",
    "http_insecure": "local's HTTP ingest is always open",
    "tls_cert": "local serves no TLS",
    "tls_key": "local serves no TLS",
    "tls_client_ca": "local serves no TLS",
    "pool_size": "local's ingest pool is 4 connections, beside its workers' and the sweeper's",
}


def ingest_settings_options(command: F) -> F:
    """The settings of what ingest accepts and how long it waits, declared once for ``inturn
    ingest`` and ``inturn local``: sizes, timeouts, the duplicate windows, the registry
    refresh, the identifier index bound, batches, memory, feeds. The command receives them as
    one keyword argument, ``ingest_settings``: a dict of
    :meth:`inturn.worker.ingest.config.IngestConfig.from_options` keywords (``--refresh`` is
    its ``refresh_seconds``), so that an option added here reaches both commands' configuration
    with no other change."""
    from inturn.worker.hl7.pid import MAX_INDEXED_IDENTIFIERS
    from inturn.worker.ingest.accept import (
        DEFAULT_DELIVERED_WINDOW_SECONDS,
        DEFAULT_DUPLICATE_WINDOW_SECONDS,
        DEFAULT_MAX_BATCH_MESSAGES,
        DEFAULT_STORE_TIMEOUT_SECONDS,
    )
    from inturn.worker.ingest.budget import DEFAULT_WAIT_SECONDS
    from inturn.worker.ingest.config import DEFAULT_FLUSH_SECONDS, DEFAULT_MAX_SENDERS
    from inturn.worker.ingest.listener import (
        DEFAULT_FRAME_DEADLINE,
        DEFAULT_FRAME_TIMEOUT,
        DEFAULT_IDLE_TIMEOUT,
        DEFAULT_MAX_FRAME_BYTES,
    )
    from inturn.worker.ingest.routing import DEFAULT_REFRESH_SECONDS

    declared = (
        click.option(
            "--max-frame-bytes",
            default=str(DEFAULT_MAX_FRAME_BYTES),
            show_default=True,
            help="Largest message accepted (bytes; suffixes k, M, G are powers of 1024).",
        ),
        click.option(
            "--idle-timeout",
            type=float,
            default=DEFAULT_IDLE_TIMEOUT,
            show_default=True,
            help="Seconds an idle connection stays open.",
        ),
        click.option(
            "--frame-timeout",
            type=float,
            default=DEFAULT_FRAME_TIMEOUT,
            show_default=True,
            help="Seconds without a byte inside a frame before the connection is closed.",
        ),
        click.option(
            "--frame-deadline",
            type=float,
            default=DEFAULT_FRAME_DEADLINE,
            show_default=True,
            help="Seconds an MLLP frame may take from its first byte to its last.",
        ),
        click.option(
            "--duplicate-window",
            type=float,
            default=DEFAULT_DUPLICATE_WINDOW_SECONDS,
            show_default=True,
            help="Seconds a message is remembered to recognise a copy received again (0: off).",
        ),
        click.option(
            "--duplicate-delivered-window",
            type=float,
            default=DEFAULT_DELIVERED_WINDOW_SECONDS,
            show_default=True,
            help="Seconds after its earlier copy's delivery during which a copy received again"
            " is taken for a sender that lost our ACK (AA, not queued); later, or after a"
            " failure, skip or erasure, it is queued again as a re-send.",
        ),
        click.option(
            "--refresh",
            "refresh_seconds",
            type=float,
            default=DEFAULT_REFRESH_SECONDS,
            show_default=True,
            help="Seconds between reads of the destination registry.",
        ),
        click.option(
            "--store-timeout",
            type=float,
            default=DEFAULT_STORE_TIMEOUT_SECONDS,
            show_default=True,
            help="Seconds to store one message; past it the transaction is cancelled, and AE is"
            " answered once its rollback is seen (AA if it had committed).",
        ),
        click.option(
            "--max-indexed-identifiers",
            type=click.IntRange(min=1),
            default=MAX_INDEXED_IDENTIFIERS,
            show_default=True,
            help="Most distinct patient identifiers (PID-2/3/4, MRG-1) indexed per message; the"
            " rest are stored but not found by --patient-id.",
        ),
        click.option(
            "--max-batch-messages",
            type=click.IntRange(min=1),
            default=DEFAULT_MAX_BATCH_MESSAGES,
            show_default=True,
            help="Most messages in one HL7 batch (FHS/BHS ... BTS/FTS); a larger batch is"
            " refused whole (AR, ERR 104).",
        ),
        click.option(
            "--memory-limit",
            envvar="INTURN_MEMORY_LIMIT",
            metavar="SIZE",
            help="Memory ingest may use (bytes; k, M, G and Ki, Mi, Gi are powers of 1024); the"
            " message budget is (SIZE - 96 MiB) / 4. Default: the container's (cgroup's)"
            " limit, else 512 MiB. The chart sets it from the pod's memory limit.",
        ),
        click.option(
            "--busy-wait",
            type=float,
            default=DEFAULT_WAIT_SECONDS,
            show_default=True,
            help="Seconds a message waits for memory before it is answered AE (busy).",
        ),
        click.option(
            "--feed-flush-seconds",
            type=click.FloatRange(min=0.1),
            default=DEFAULT_FLUSH_SECONDS,
            show_default=True,
            help="Seconds between two writes of the feeds' last message times (never one per"
            " message).",
        ),
        click.option(
            "--max-feed-senders",
            type=click.IntRange(min=0),
            default=DEFAULT_MAX_SENDERS,
            show_default=True,
            help="Most senders (MSH-3/MSH-4) recorded per per-sender feed, kept by the database"
            " for every replica; others count for the channel.",
        ),
    )

    @functools.wraps(command)
    def collect(*args: Any, **kwargs: Any) -> Any:
        settings = {name: kwargs.pop(name) for name in INGEST_SETTINGS}
        return command(*args, ingest_settings=settings, **kwargs)

    wrapped: Any = collect
    for option in reversed(declared):
        wrapped = option(wrapped)
    return wrapped  # type: ignore[no-any-return]


#: The ``IngestConfig.from_options`` keywords :func:`ingest_settings_options` collects.
INGEST_SETTINGS = (
    "max_frame_bytes",
    "idle_timeout",
    "frame_timeout",
    "frame_deadline",
    "duplicate_window",
    "duplicate_delivered_window",
    "refresh_seconds",
    "store_timeout",
    "max_indexed_identifiers",
    "max_batch_messages",
    "memory_limit",
    "busy_wait",
    "feed_flush_seconds",
    "max_feed_senders",
)


#: An item id as the database keeps it (``bigint``, from 1): a number past it is a clear usage
#: error naming the argument, not a database error ("bigint out of range").
ITEM_ID = click.IntRange(1, 2**63 - 1)
