"""Moved to :mod:`tests.support.booking_data` (issue 32): import it from there; this old name goes
once every branch of the round has moved."""

from tests.support.booking_data import *  # noqa: F403
