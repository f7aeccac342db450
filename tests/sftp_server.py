"""Moved to :mod:`tests.support.sftp_server` (issue 32): import it from there; this old name goes
once every branch of the round has moved."""

from tests.support.sftp_server import *  # noqa: F403
