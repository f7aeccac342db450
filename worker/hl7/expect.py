"""Which acknowledgements a message asks its receiver to send (MSH-15, MSH-16).

Source: HL7 v2.5 chapter 2, "Acknowledgment messages": original and enhanced acknowledgment
modes, MSH-15 (accept acknowledgment type), MSH-16 (application acknowledgment type) and
table 0155 (AL always, NE never, ER on error/reject only, SU on successful completion only).

One pure rule serves both ends, so that an inturn relaying to another inturn agrees with it:

* **Original mode** (MSH-15 and MSH-16 both empty): one acknowledgement, AA / AE / AR, always.
  It is counted as the application level below.
* **Enhanced mode** (either field filled): the *accept* acknowledgement (CA / CE / CR) is due
  when MSH-15's condition holds, the *application* acknowledgement (AA / AE / AR) when MSH-16's
  does. An empty MSH-15 is read as AL (a receiver that stores the message says so: that is the
  commit acknowledgement) and an empty MSH-16 as NE (nobody asked for a second answer); a value
  outside table 0155 is read as AL, because waiting for an answer that does not come is a
  visible failure while not waiting for one that does is silent.

The sender waits for exactly the levels :func:`due` gives for success: AL and SU are awaited,
ER and NE are not (an ER answer comes only when something went wrong, so on success there is
nothing to wait for). When no level is due the message is delivered once written and flushed.
"""

from __future__ import annotations

from typing import Literal

from inturn.worker.hl7.header import Header

Level = Literal["accept", "application"]
Condition = Literal["AL", "NE", "ER", "SU"]

_CONDITIONS: frozenset[str] = frozenset({"AL", "NE", "ER", "SU"})


def enhanced(header: Header) -> bool:
    """Whether the message asks for enhanced mode (MSH-15 or MSH-16 filled)."""
    return bool(header.accept_ack_type or header.application_ack_type)


def _condition(value: str, empty: Condition) -> Condition:
    if not value:
        return empty
    if value in _CONDITIONS:
        return value  # type: ignore[return-value]
    return "AL"


def accept_condition(header: Header) -> Condition:
    """MSH-15 as a table 0155 condition (enhanced mode): empty or unknown reads as AL."""
    return _condition(header.accept_ack_type, "AL")


def application_condition(header: Header) -> Condition:
    """MSH-16 as a table 0155 condition (enhanced mode): empty reads as NE, unknown as AL."""
    return _condition(header.application_ack_type, "NE")


def holds(condition: Condition, success: bool) -> bool:
    """Whether an acknowledgement under ``condition`` is sent for this ``success``."""
    if condition == "NE":
        return False
    if condition == "ER":
        return not success
    if condition == "SU":
        return success
    return True


def due(header: Header, success: bool) -> tuple[Level, ...]:
    """The acknowledgement levels the receiver sends, in the order they are sent.

    Original mode: ``("application",)`` whatever ``success`` is. Enhanced mode: ``accept``
    when MSH-15's condition holds, then ``application`` when MSH-16's does; possibly neither.
    """
    if not enhanced(header):
        return ("application",)
    levels: list[Level] = []
    if holds(accept_condition(header), success):
        levels.append("accept")
    if holds(application_condition(header), success):
        levels.append("application")
    return tuple(levels)


Kind = Literal["accept", "error", "reject"]

_LEVEL_CODES: dict[Level, dict[Kind, str]] = {
    "accept": {"accept": "CA", "error": "CE", "reject": "CR"},
    "application": {"accept": "AA", "error": "AE", "reject": "AR"},
}


def answer_codes(header: Header, kind: Kind) -> tuple[str, ...]:
    """The MSA-1 codes a receiver that stores messages sends, in order, for this outcome.

    Original mode: one of AA / AE / AR. Enhanced mode, on success: CA when the accept level is
    due, then AA when the application level is due. On error or reject: CE / CR when the accept
    level is due; otherwise AE / AR when the application level is due (the message never reached
    the application, so one negative answer ends the exchange); otherwise nothing.
    """
    levels = due(header, kind == "accept")
    if kind == "accept":
        return tuple(_LEVEL_CODES[level][kind] for level in levels)
    return tuple(_LEVEL_CODES[level][kind] for level in levels[:1])
