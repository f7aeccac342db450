"""One base error for inturn, a small tree, and the built-in base each error had kept."""

from __future__ import annotations

import pytest

from inturn.worker import errors
from inturn.worker.console.auth import AuthConfigError
from inturn.worker.drain.steps import SessionLost
from inturn.worker.feeds.declare import FeedsError
from inturn.worker.hl7.errors import AckParseError, HeaderError, HL7Error
from inturn.worker.ingest.batch import OutcomeUnknown, StoreTimeout
from inturn.worker.ingest.credentials import CredentialsError
from inturn.worker.operations.packs import UnknownPack
from inturn.worker.reservations.bookings import SegmentNotFound
from inturn.worker.reservations.records import BookingFileError
from inturn.worker.senders.base import DeliveryError
from inturn.worker.spec.destination import ManifestError
from inturn.worker.spec.schedule import ScheduleError
from inturn.worker.store.dsn import DsnError, DsnMissing
from inturn.worker.store.lockwatch import LockWaitError
from inturn.worker.store.registry import CarrierTaken
from inturn.worker.store.roles_apply import RolesError
from inturn.worker.store.worklist import AlreadyCleared, ItemNotFound
from inturn.worker.worklist.publishers.webhook import WebhookError


@pytest.mark.parametrize(
    ("error", "kind", "builtin"),
    [
        (SegmentNotFound, errors.NotFound, LookupError),
        (ItemNotFound, errors.NotFound, LookupError),
        (AlreadyCleared, errors.Conflict, ValueError),
        (CarrierTaken, errors.Conflict, ValueError),
        (ManifestError, errors.Invalid, ValueError),
        (ScheduleError, errors.Invalid, ValueError),
        (BookingFileError, errors.Invalid, ValueError),
        (FeedsError, errors.Invalid, ValueError),
        (CredentialsError, errors.Invalid, ValueError),
        (AuthConfigError, errors.Invalid, ValueError),
        (UnknownPack, errors.Invalid, ValueError),
        (DsnError, errors.Invalid, ValueError),
        (DsnMissing, errors.Invalid, ValueError),
        (HL7Error, errors.Invalid, ValueError),
        (HeaderError, errors.Invalid, ValueError),
        (AckParseError, errors.Invalid, ValueError),
        (StoreTimeout, errors.Unavailable, Exception),
        (OutcomeUnknown, errors.Unavailable, Exception),
        (LockWaitError, errors.Unavailable, Exception),
        (SessionLost, errors.Unavailable, Exception),
        (DeliveryError, errors.Unavailable, Exception),
        (WebhookError, errors.Unavailable, Exception),
        (RolesError, errors.InturnError, Exception),
    ],
)
def test_every_error_has_one_base_and_keeps_its_builtin(
    error: type[Exception], kind: type[errors.InturnError], builtin: type[Exception]
) -> None:
    assert issubclass(error, kind) and issubclass(error, errors.InturnError)
    assert issubclass(error, builtin)


def test_the_kinds_are_stable_words() -> None:
    assert [c.kind for c in (errors.NotFound, errors.Conflict, errors.ReasonRequired)] == [
        "not_found",
        "conflict",
        "reason_required",
    ]
    assert [c.kind for c in (errors.Forbidden, errors.Invalid, errors.Unavailable)] == [
        "forbidden",
        "invalid_request",
        "unavailable",
    ]
