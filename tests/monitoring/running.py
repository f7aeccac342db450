"""Moved to :mod:`tests.support.local` (issue 32): import it from there; this old name goes
once every branch of the round has moved."""

from tests.support.local import *  # noqa: F403
