"""The ``inturn`` command line (click).

Subcommands live in their own modules and are imported only when used, so ``inturn worker``
never imports the operator. Bad arguments print one line and exit 2; so does an unreachable
database or a missing DSN. Nothing prints a traceback except ``--debug``.

Layer: front end (with ``local``, ``console``, ``drain`` and ``ingest``). It parses, formats and
calls ``operations`` for every action; it may use any layer below. Nothing imports it but the
console-script entry point, ``inturn.worker.entry``.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click
import psycopg
import psycopg.errors

from inturn.worker.errors import Conflict, Invalid, NotFound
from inturn.worker.store.dsn import DsnError, permission_denied, schema_missing
from inturn.worker.store.faults import connection_gone
from inturn.worker.store.lockwatch import LockWaitError

#: name -> "module:attribute" of each subcommand.
COMMANDS: dict[str, str] = {
    "migrate": "inturn.worker.cli.maintenance:migrate_command",
    "queue": "inturn.worker.cli.queue:queue_group",
    "purge": "inturn.worker.cli.maintenance:purge_command",
    "worklist": "inturn.worker.cli.worklist:worklist_group",
    "sweep": "inturn.worker.cli.sweep:sweep_command",
    "worker": "inturn.worker.cli.worker:worker_command",
    "ingest": "inturn.worker.cli.ingest:ingest_command",
    "token": "inturn.worker.cli.ingest:token_command",
    "local": "inturn.worker.cli.local:local_command",
    "console": "inturn.worker.cli.console:console_command",
    "operator": "inturn.operator.cli:operator_command",
    "crd": "inturn.operator.cli:crd_command",
    "receiver": "inturn.worker.cli.receiver:receiver_command",
    "send": "inturn.worker.cli.send:send_command",
    "validate": "inturn.worker.cli.validate:validate_command",
    "keys": "inturn.worker.cli.keys:keys_group",
}

#: Libraries of optional extras (pyproject.toml) -> the extra that installs them.
EXTRAS: dict[str, str] = {
    "kopf": "operator",
    "kubernetes": "operator",
    "pgserver": "local",
    "opentelemetry": "tracing",
}


def missing_extra(exc: ModuleNotFoundError, command: str) -> str | None:
    """The one-line error for ``inturn COMMAND`` failing on ``exc``, a library of an optional
    extra that is not installed (``inturn operator needs kopf: pip install 'inturn[operator]'``),
    or None when the missing module is not one of :data:`EXTRAS`'s."""
    extra = EXTRAS.get((exc.name or "").split(".")[0])
    if extra is None:
        return None
    return f"inturn {command} needs {exc.name}: pip install 'inturn[{extra}]'"


def _command_name(argv: list[str]) -> str:
    """The subcommand ``argv`` names (its first word that is one of :data:`COMMANDS` or of an
    active rule pack's commands)."""
    return next((a for a in argv if a in COMMANDS or a in _pack_commands()), "")


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every subcommand name, sorted: inturn's own and the active rule packs' (their
        modules are not imported)."""
        return sorted({*COMMANDS, *_pack_commands()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """Import and return the subcommand ``cmd_name``; None for an unknown name.

        Raises:
            click.ClickException: ``cmd_name`` is a command of a pack that is not installed
                (the message says which extra installs it).
        """
        target = COMMANDS.get(cmd_name) or _pack_commands().get(cmd_name)
        if target is None:
            from inturn.worker.operations import packs

            pack = packs.inactive_command(cmd_name)
            if pack is not None:
                raise click.ClickException(
                    f"inturn {cmd_name} is the {pack.name} pack's, not installed here:"
                    f" {pack.install_hint()}"
                )
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                return None  # not built yet
            said = missing_extra(exc, cmd_name)
            if said is None:
                raise
            raise click.ClickException(said) from None
        command = getattr(module, attr, None)
        return command if isinstance(command, click.Command) else None


def _pack_commands() -> dict[str, str]:
    """The command groups of the active rule packs (:mod:`inturn.worker.operations.packs`),
    found only when a name is not inturn's own or the list is asked for."""
    from inturn.worker.operations import packs

    return packs.commands()


@click.group(cls=LazyGroup, invoke_without_command=True)
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.version_option(package_name="inturn", prog_name="inturn")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """inturn: durable, in-order, per-destination HL7 v2 delivery queues."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())  # `inturn` alone: the help, not an error


def fail(message: str) -> None:
    """Print ``inturn: error: <message>`` on stderr and exit 2."""
    click.echo(f"inturn: error: {message}", err=True)
    sys.exit(2)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def database_error(exc: psycopg.Error) -> str:
    """The one-line error of a command for a database error ``exc``: a timeout; a server that
    cannot be reached or a connection psycopg lost (no SQLSTATE); a session the server ended,
    whatever the class of its code (:func:`inturn.worker.store.faults.connection_gone`: 57P05
    or 25P03 after a DBA's idle timeout read like a restart, not as "database error"); then a
    missing schema, a missing privilege, an unusable DSN, anything else."""
    if isinstance(exc, psycopg.errors.QueryCanceled):  # reached, but outlasted a timeout
        return f"the database did not finish in time: {_first_line(exc)}"
    if isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None:
        # psycopg's own words say which: refused, unknown host, closed unexpectedly, ...
        return f"cannot reach the database: {_first_line(exc)}"
    if connection_gone(exc):
        code = f", SQLSTATE {exc.sqlstate}" if exc.sqlstate else ""
        return (
            f"the database connection was lost ({type(exc).__name__}{code}):"
            f" {_first_line(exc)}; run the command again"
        )
    if isinstance(exc, psycopg.OperationalError):
        return f"cannot reach the database: {_first_line(exc)}"
    if isinstance(
        exc,
        psycopg.errors.UndefinedTable
        | psycopg.errors.UndefinedColumn
        | psycopg.errors.UndefinedFunction,
    ):
        return schema_missing(exc)
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return permission_denied(exc)
    if isinstance(exc, psycopg.ProgrammingError) and exc.sqlstate is None:
        return f"invalid database connection string: {_first_line(exc)}"  # refused by psycopg
    return f"database error: {_first_line(exc)}"


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point: run the command line, one-line errors, exit codes 0/1/2."""
    args = argv if argv is not None else sys.argv[1:]
    debug = "--debug" in args
    try:
        return cli.main(args=argv, prog_name="inturn", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("inturn: aborted", err=True)
        sys.exit(1)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "inturn"
        fail(f"{exc.format_message()} (see '{where} --help')")
    except click.ClickException as exc:
        fail(exc.format_message())
    except DsnError as exc:
        fail(str(exc))
    except LockWaitError as exc:
        if debug:
            raise
        fail(str(exc))
    except (NotFound, Conflict, Invalid) as exc:  # an action's refusal or bad input: one line
        if debug:
            raise
        fail(str(exc))
    except psycopg.Error as exc:
        if debug:
            raise
        fail(database_error(exc))
    except OSError as exc:
        # Ports already taken, unresolvable hosts, unreadable files: the system's own words.
        if debug:
            raise
        fail(_first_line(exc))
    except ModuleNotFoundError as exc:
        # an extra's library imported when the command runs (inturn operator's kopf)
        said = missing_extra(exc, _command_name(args))
        if said is None or debug:
            raise
        fail(said)
    except KeyboardInterrupt:
        sys.exit(130)
    return None
