"""The operator's one error of its own: :class:`TransientError`, what a handler retries."""

from __future__ import annotations


class TransientError(Exception):
    """The database or the API is unavailable; the caller should retry later."""
