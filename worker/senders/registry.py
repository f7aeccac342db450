"""The sender kinds, listed once. Everything that depends on the kind of a destination's
sender (the schema, the rendered configuration, the operator's Secret mounts and status
summary, ``inturn local``'s start-up checks, the worker's constructor) loops over :data:`KINDS`.

Adding a kind: write its module (a :class:`~inturn.worker.senders.kind.SenderKind` instance
named ``KIND``) and add it here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inturn.worker.senders import http, mllp, sftp
from inturn.worker.senders.base import Sender
from inturn.worker.senders.kind import SenderConfig, SenderKind

#: Every sender kind, in the order they are documented.
KINDS: tuple[SenderKind[Any], ...] = (mllp.KIND, http.KIND, sftp.KIND)

_BY_NAME: dict[str, SenderKind[Any]] = {kind.name: kind for kind in KINDS}
_BY_CONFIG: dict[type[SenderConfig], SenderKind[Any]] = {kind.config_type: kind for kind in KINDS}


def names() -> tuple[str, ...]:
    """The kinds' names (the keys of ``spec.sender``)."""
    return tuple(_BY_NAME)


def of_spec(sender: Mapping[str, Any]) -> tuple[SenderKind[Any], Mapping[str, Any]] | None:
    """The kind set in a ``spec.sender`` (or rendered ``sender``) node and its member node;
    None when no kind is set (validation reports it)."""
    for kind in KINDS:
        if kind.name in sender:
            return kind, sender[kind.name]
    return None


def of_config(config: SenderConfig) -> SenderKind[Any]:
    """The kind of a sender configuration.

    Raises:
        TypeError: ``config`` is not the configuration of a registered kind.
    """
    kind = _BY_CONFIG.get(type(config))
    if kind is None:
        raise TypeError(f"unknown sender configuration {type(config).__name__}")
    return kind


def to_dict(config: SenderConfig) -> dict[str, Any]:
    """The rendered ``sender`` node, e.g. ``{"mllp": {...}}``."""
    kind = of_config(config)
    return {kind.name: kind.to_dict(config)}


def from_dict(sender: Mapping[str, Any]) -> SenderConfig:
    """The configuration of a rendered ``sender`` node.

    Raises:
        KeyError: no registered kind is set.
    """
    found = of_spec(sender)
    if found is None:
        raise KeyError(f"sender: none of {', '.join(names())}")
    kind, node = found
    config: SenderConfig = kind.from_dict(node)
    return config


def make_sender(config: SenderConfig, *, body_charset: str | None = None) -> Sender:
    """The sender for ``config`` (its kind's constructor).

    ``body_charset``: the charset every message it sends is in, when a receiver profile
    converts it (``spec.profile.charset``, :attr:`inturn.worker.spec.config.WorkerConfig.
    body_charset`, an IANA name); an HTTP sender names it in its ``Content-Type``. None: not
    known (the message is sent in whatever charset it was stored in).

    Raises:
        TypeError: not the configuration of a registered kind.
        OSError, ssl.SSLError, ValueError: a file it needs cannot be loaded.
    """
    sender = of_config(config).build(config)
    if body_charset is not None and isinstance(sender, http.HttpSender):
        sender.body_charset = body_charset
    return sender


def refusal(kind: str | None, payload: bytes) -> str | None:
    """Why a sender of the kind named ``kind`` could never send ``payload``, or None (also for
    an unknown or unrecorded kind). See :meth:`SenderKind.refusal`."""
    found = _BY_NAME.get(kind) if kind is not None else None
    return found.refusal(payload) if found is not None else None


def secret_keys(sender: Mapping[str, Any]) -> dict[str, set[str]]:
    """``{Secret name: keys}`` a ``spec.sender`` node mounts (empty without Secrets)."""
    found = of_spec(sender)
    return found[0].secret_keys(found[1]) if found else {}


def summary(sender: Mapping[str, Any]) -> str:
    """The credential-free one-line summary of a ``spec.sender`` node (``none`` when unset)."""
    found = of_spec(sender)
    return found[0].summary(found[1]) if found else "none"


def problems(sender: Mapping[str, Any], prefix: str) -> list[str]:
    """What the sender of a (schema-valid, defaulted) ``spec.sender`` or rendered ``sender``
    node would refuse (:meth:`SenderKind.problems`), as ``prefix.<kind>.field: problem``
    lines; empty when it can send or no kind is set (the schema reports that)."""
    found = of_spec(sender)
    if found is None:
        return []
    kind, node = found
    return [f"{prefix}.{kind.name}.{line}" for line in kind.problems(node)]


def check(config: SenderConfig) -> list[str]:
    """Start-up problems of a sender configuration (empty when it can start)."""
    return of_config(config).check(config)


def first_problem(destination: str, config: SenderConfig) -> str | None:
    """The first start-up problem of ``destination``'s sender as one line naming it (a missing
    file with a ``--secrets-dir`` hint), or None when it can start: what ``inturn local`` and
    ``inturn worker`` refuse to start with."""
    problems = check(config)
    if not problems:
        return None
    hint = " (see --secrets-dir)" if problems[0].startswith("no file ") else ""
    return f"destination {destination}: {problems[0]}{hint}"
