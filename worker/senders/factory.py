"""Build the sender a destination's configuration asks for."""

from __future__ import annotations

from ..config import HttpSenderConfig, MllpSenderConfig, SenderConfig
from .base import Sender
from .http import HttpSender
from .mllp import MllpSender


def make_sender(config: SenderConfig) -> Sender:
    """An :class:`MllpSender` or :class:`HttpSender` for ``config``.

    Raises:
        TypeError: ``config`` is neither sender configuration.
        OSError, ssl.SSLError, ValueError: the TLS files cannot be loaded.
    """
    if isinstance(config, MllpSenderConfig):
        return MllpSender(config)
    if isinstance(config, HttpSenderConfig):
        return HttpSender(config)
    raise TypeError(f"unknown sender configuration {type(config).__name__}")
