"""Moved to :mod:`tests.support.console` (issue 32): import it from there; this old name goes
once every branch of the round has moved."""

from tests.support.console import *  # noqa: F403
