"""Moved to :mod:`tests.support.netpart` (issue 32): import it from there; this old name goes
once every branch of the round has moved."""

from tests.support.netpart import *  # noqa: F403
