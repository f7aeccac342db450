"""What a sender kind declares: the contract every ``spec.sender.<kind>`` module fulfils.

A sender kind is one module (:mod:`.mllp`, :mod:`.http`, :mod:`.sftp`) holding one instance of
a :class:`SenderKind` subclass that says everything about the kind: its name (the key under
``spec.sender``), its configuration dataclass and its JSON mapping, its spec-schema node and
its rendered (worker) schema node, the Secret keys it mounts, its credential-free summary, its
start-up checks and its constructor. :mod:`.registry` lists the kinds; the schema, the
renderer, the operator's manifests and ``inturn local`` loop over it, so that adding a kind
touches its module and the registry only.

Pure: no I/O library is imported here, and a kind imports its transport library (aiohttp,
asyncssh) only in :meth:`SenderKind.build`, so a worker loads only the one it uses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from inturn.worker.crypto.keyfiles import KeyFileExposed, check_key_file
from inturn.worker.senders.base import Sender
from inturn.worker.spec.openapi import Schema

#: ``secret_file(secret name, key) -> path`` where a Secret key is mounted (or laid out locally).
SecretFile = Callable[[str, str], str]


@dataclass(frozen=True)
class SenderConfig:
    """Base of every kind's configuration dataclass (``WorkerConfig.sender``)."""


C = TypeVar("C", bound=SenderConfig)


class SenderKind(ABC, Generic[C]):
    """One kind of sender. Subclasses set :attr:`name` and :attr:`config_type` and implement
    every method; the instance is registered in :data:`inturn.worker.senders.registry.KINDS`.
    """

    #: The key under ``spec.sender`` (and under the rendered ``sender``), e.g. ``mllp``.
    name: ClassVar[str]
    #: The configuration dataclass (a frozen subclass of :class:`SenderConfig`).
    config_type: ClassVar[type[SenderConfig]]

    @abstractmethod
    def spec_schema(self) -> Schema:
        """The structural schema node of ``spec.sender.<name>`` (Secrets by reference)."""

    @abstractmethod
    def worker_schema(self) -> Schema:
        """The schema node of the rendered ``sender.<name>`` (Secret keys as file paths)."""

    @abstractmethod
    def render(self, spec: Mapping[str, Any], secret_file: SecretFile) -> dict[str, Any]:
        """Turn a defaulted ``spec.sender.<name>`` node into its rendered node, Secret
        references becoming paths through ``secret_file``."""

    @abstractmethod
    def from_dict(self, doc: Mapping[str, Any]) -> C:
        """Build the configuration from a (validated, defaulted) rendered node.

        Raises:
            KeyError, TypeError: a required key is missing or mistyped.
        """

    @abstractmethod
    def to_dict(self, config: C) -> dict[str, Any]:
        """The rendered node of ``config``; ``from_dict(to_dict(c)) == c``."""

    @abstractmethod
    def secret_keys(self, spec: Mapping[str, Any]) -> dict[str, set[str]]:
        """``{Secret name: keys}`` the worker pod must mount for a ``spec.sender.<name>``
        node (the operator mounts them by reference and never reads them)."""

    @abstractmethod
    def summary(self, spec: Mapping[str, Any]) -> str:
        """A one-line description without credentials, for ``status.sender`` and logs."""

    @abstractmethod
    def files(self, config: C) -> Iterable[str]:
        """The files the sender reads (mounted Secret keys): a start-up check says which one
        is missing before anything starts."""

    @abstractmethod
    def build(self, config: C) -> Sender:
        """The sender for ``config``; imports the transport library on first use.

        Raises:
            OSError, ValueError: a file it needs cannot be read or is not valid.
        """

    def problems(self, node: Mapping[str, Any]) -> list[str]:
        """What a sender of this kind would refuse about a (schema-valid, defaulted)
        ``spec.sender.<name>`` or rendered ``sender.<name>`` node, beyond what the schema
        says: ``field: problem`` lines relative to the node, empty when it can send
        (:mod:`inturn.worker.senders.shape`). The manifest's validation reports them, and
        :meth:`build` refuses the same (:meth:`refuse_shape`). The default: none."""
        return []

    def refuse_shape(self, config: C) -> None:
        """Raise what :meth:`problems` says of ``config``'s rendered node; :meth:`build` calls
        it first, so that validation and construction decide alike.

        Raises:
            ValueError: the first problem, as ``field: problem``.
        """
        problems = self.problems(self.to_dict(config))
        if problems:
            raise ValueError(problems[0])

    def refusal(self, payload: bytes) -> str | None:
        """Why this kind could never send ``payload`` (no retry could help), or None.

        Ingest refuses such a message at the door for a destination of this kind, and the
        sender fails a stored one as ``unsendable``. The default: every message can be sent.
        """
        return None

    def secret_files(self, config: C) -> Iterable[str]:
        """The files of :meth:`files` that hold secrets (a private key, a password, request
        credentials): a start-up check refuses one that other users may read
        (:func:`inturn.worker.crypto.keyfiles.check_key_file`). The default: none."""
        return []

    def check(self, config: C) -> list[str]:
        """Start-up problems of ``config``, one line each (empty when it can start): the
        missing :meth:`files`, the :meth:`secret_files` others may read, then whatever
        :meth:`build` refuses."""
        missing = [f"no file {path}" for path in self.files(config) if not Path(path).is_file()]
        if missing:
            return missing
        exposed = []
        for path in self.secret_files(config):
            try:
                check_key_file(path, "sender")
            except KeyFileExposed as exc:
                exposed.append(str(exc))
        if exposed:
            return exposed
        try:
            self.build(config)
        except (OSError, ValueError) as exc:
            return [f"its sender cannot be built: {exc}"]
        return []
