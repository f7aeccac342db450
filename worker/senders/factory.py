"""Build the sender a destination's configuration asks for.

Each sender's module is imported only when a destination uses it: an MLLP worker never loads
the HTTP client library (aiohttp, about 12 MiB of a worker's memory).
"""

from __future__ import annotations

from ..config import HttpSenderConfig, MllpSenderConfig, SenderConfig
from .base import Sender


def make_sender(config: SenderConfig) -> Sender:
    """An :class:`MllpSender` or :class:`HttpSender` for ``config``.

    Raises:
        TypeError: ``config`` is neither sender configuration.
        OSError, ssl.SSLError, ValueError: the TLS files cannot be loaded.
    """
    if isinstance(config, MllpSenderConfig):
        from .mllp import MllpSender

        return MllpSender(config)
    if isinstance(config, HttpSenderConfig):
        from .http import HttpSender

        return HttpSender(config)
    raise TypeError(f"unknown sender configuration {type(config).__name__}")
