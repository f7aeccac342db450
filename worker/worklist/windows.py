"""Which weekly schedules are open at an instant, as parameters for a sweeper query.

The sweeper's predicates stay in SQL, but time zones and daylight saving time are judged in one
place only, :mod:`inturn.worker.spec.schedule`. A rule therefore reads the distinct schedules
its records use (few: most share one), judges each at the database's ``now()`` here, and passes
the open ones to its query as two arrays: ``schedules`` (jsonb, compared with ``=``) and
``since`` (when each opening began; NULL when the schedule is open at all times). A record
whose schedule is not in ``schedules`` is outside its window.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from inturn.worker.spec.schedule import ScheduleError, parse

log = logging.getLogger("inturn.worklist.windows")


def open_windows(schedules: Iterable[Mapping[str, Any]], at: datetime) -> dict[str, list[Any]]:
    """The query parameters ``schedules`` and ``since`` for the schedules open at ``at``.

    A schedule that cannot be read (a time zone this process does not know) is counted as
    open at all times, and logged: a rule must not go silent because of it.

    Args:
        schedules: schedules in spec form (``{"timeZone": ..., "windows": [...]}``).
        at: the instant (aware), normally the database's ``now()``.
    """
    out: dict[str, list[Any]] = {"schedules": [], "since": []}
    for schedule in schedules:
        try:
            state = parse(schedule).state(at)
        except ScheduleError as exc:
            log.warning("a schedule cannot be read (%s); it is taken as always open", exc)
            out["schedules"].append(Jsonb(dict(schedule)))
            out["since"].append(None)
            continue
        if state.open:
            out["schedules"].append(Jsonb(dict(schedule)))
            out["since"].append(state.since)
    return out
