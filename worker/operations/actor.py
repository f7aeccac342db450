"""Who acts and the rule of each action: the role it needs and whether it needs a reason.

:data:`ACTIONS` is the one table of these rules; :func:`permit` applies it, whichever front end
asks (the command line, the console, the sweeper, the purge job).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from inturn.worker.errors import Forbidden, Invalid, ReasonRequired
from inturn.worker.store.worklist_model import NOTE_MAX

#: Longest reason kept, in characters.
REASON_MAX = 500


@dataclass(frozen=True)
class Action:
    """The rule of one action: the role it needs, whether it needs a reason (``word`` says
    what the reason is called) and the longest reason kept, in characters."""

    name: str
    role: str
    reason_required: bool = False
    word: str = "reason"
    longest: int = REASON_MAX


#: Every action on the delivery queues and its rule, whoever calls.
ACTIONS: Mapping[str, Action] = {
    a.name: a
    for a in (
        Action("retry", "operator"),
        Action("skip", "operator", reason_required=True),
        Action("drain", "operator", reason_required=True),
        Action("resend", "operator"),
        Action("remove", "operator"),
        Action("suspend", "operator"),
        Action("resume", "operator"),
        Action("mark-delivered", "operator", reason_required=True),
        Action("erase", "privacy", reason_required=True),
        Action("view-payload", "privacy", reason_required=True),
        Action("search-patient", "privacy", reason_required=True),
        Action("purge", "operator"),
        Action("clear", "operator", reason_required=True, word="note", longest=NOTE_MAX),
    )
}


class Actor(Protocol):
    """Who acts: ``name`` goes into the audit; ``can`` says whether they hold a role."""

    @property
    def name(self) -> str:
        """The name recorded as ``who``."""
        ...

    def can(self, role: str) -> bool:
        """Whether the actor holds ``role``."""
        ...


@dataclass(frozen=True)
class Trusted:
    """An actor whose rights the database decides (the command line, the sweeper, the purge
    job): it connects with its own role, so :func:`permit` checks no role here."""

    name: str

    def can(self, role: str) -> bool:
        """Always true: the database role of the connection decides."""
        return True


def permit(actor: Actor, action: str, why: str | None) -> str | None:
    """Check that ``actor`` may take ``action`` and return its normalised reason.

    Returns the reason stripped, None when empty.

    Raises:
        Forbidden: the actor lacks the action's role.
        ReasonRequired: the action needs a reason and none was given.
        Invalid: the reason is longer than the action allows or holds a NUL character.
    """
    rule = ACTIONS[action]
    if not actor.can(rule.role):
        raise Forbidden(f"this needs the {rule.role} role")
    text = (why or "").strip()
    if "\x00" in text:
        raise Invalid(f"a {rule.word} cannot hold a NUL character")
    if len(text) > rule.longest:
        raise Invalid(f"a {rule.word} is at most {rule.longest} characters")
    if not text and rule.reason_required:
        raise ReasonRequired(f"{action} needs a {rule.word}")
    return text or None
