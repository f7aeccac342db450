"""Moved to :mod:`tests.support.helm_chart` (issue 32): import it from there; this old name goes
once every branch of the round has moved."""

from tests.support.helm_chart import *  # noqa: F403
