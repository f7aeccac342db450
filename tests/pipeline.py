"""Moved to :mod:`tests.support.pipeline` (issue 32): import it from there; this old name goes
once every branch of the round has moved."""

from tests.support.pipeline import *  # noqa: F403
