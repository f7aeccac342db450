"""Moved to :mod:`tests.support.prometheus_rules` (issue 32): import it from there; this old
name goes once every branch of the round has moved."""

from tests.support.prometheus_rules import *  # noqa: F403
