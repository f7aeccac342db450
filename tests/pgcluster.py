"""Moved to :mod:`tests.support.pgcluster` (issue 32): import it from there; this old name goes
once every branch of the round has moved."""

from tests.support.pgcluster import *  # noqa: F403
