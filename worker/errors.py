"""The errors inturn raises on purpose: one base, a small tree.

Every error a caller is meant to handle derives from :class:`InturnError`; its ``kind`` is a
stable word that programs match on (the console's API returns it as ``error.code``), and its
message is one line with no payload in it. The four an action can end with are
:class:`NotFound`, :class:`Conflict`, :class:`ReasonRequired` and :class:`Forbidden`;
:class:`Invalid` is input that can never be right (a manifest, a booking file, a schedule,
a DSN, an HL7 message); :class:`Unavailable` is a peer or the database that did not answer.
Each also derives from the built-in exception it refines (``LookupError``, ``ValueError``,
``PermissionError``), so a caller that catches the built-in one keeps working.

This module imports nothing from inturn: every layer may use it.
"""

from __future__ import annotations


class InturnError(Exception):
    """Base of every error inturn raises on purpose.

    Attributes:
        kind: a stable word naming the kind (``not_found``, ``conflict``...). (Not ``code``:
            the HL7 errors carry their table 0357 code under that name.)
    """

    kind = "error"


class NotFound(InturnError, LookupError):
    """What the action names does not exist (an item, a destination, a worklist item)."""

    kind = "not_found"


class Conflict(InturnError):
    """The record exists but its state does not allow the action; nothing changed, and the
    message says why (``item 7 is delivered, not pending: nothing to skip``)."""

    kind = "conflict"


class AddressInUse(Conflict):
    """An address a process was told to listen on is taken by another program; the message
    names the option that asked for it (``--console 127.0.0.1:8081 is in use``)."""


def address_in_use(exc: OSError, option: str, host: str | None, port: int) -> Exception:
    """``exc`` from binding ``host:port`` as :class:`AddressInUse` naming ``option`` (the
    command-line form, e.g. ``--listen adt=``) when the address is taken (``EADDRINUSE``);
    ``exc`` itself otherwise. Use as ``raise address_in_use(exc, ...) from None``."""
    import errno

    if exc.errno != errno.EADDRINUSE:
        return exc
    where = f"{host or '*'}:{port}"
    joined = f"{option}{where}" if option.endswith("=") else f"{option} {where}"
    return AddressInUse(
        f"{joined} is in use (another program listens there): stop it, or choose another port"
    )


class ReasonRequired(InturnError, ValueError):
    """The action abandons or exposes something and needs a reason, recorded in the audit."""

    kind = "reason_required"


class Forbidden(InturnError, PermissionError):
    """The caller does not hold the role the action needs."""

    kind = "forbidden"


class Unavailable(InturnError):
    """A peer or the database could not be reached, or did not answer in time; whether the
    action took effect is said by the subclass (a delivery attempt, a store timeout, a lost
    session, a lock wait)."""

    kind = "unavailable"


class Invalid(InturnError, ValueError):
    """Input that no state of the data could make right (a malformed argument or file)."""

    kind = "invalid_request"


class OptionInvalid(Invalid):
    """A setting of a process's configuration that is wrong, named as its command line names
    it (``option``: ``--listen``; None when the fault is a combination of settings)."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option
