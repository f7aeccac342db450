"""SFTP sender: each message becomes one file on an SFTP server (``spec.sender.sftp``).

A message is delivered when its file is completely written under its final name. With a
``temporaryName`` the bytes are written under that name first and then renamed (SFTP
``SSH_FXP_RENAME``, draft-ietf-secsh-filexfer-02 section 6.5, which refuses an existing target),
so a reader polling the directory never sees half a file. A file already there under the final
name is an error (cause ``rejected``), never overwritten: the item is retried and, as always,
nothing behind it goes first.

The server is authenticated by a known-hosts file (never trust on first use); the client by a
private key or a password, each a key of one Secret. One SSH connection is kept open between
messages and dropped after any failure or cancellation. asyncssh (a maintained SSHv2 and SFTP
library) is imported by the sender only, so a worker of another kind never loads it.

What the server sends is bounded by asyncssh itself (asyncssh 2.x, ``sftp.py`` and
``connection.py``): an SFTP reply packet over 4 MiB + 1 KiB is refused (``SFTPBadMessage``), SSH
packets by the negotiated packet size, buffered channel data by its 2 MiB window, and the
server's banner to 1,024 lines of 8 KiB; the attempt as a whole by ``retry.timeoutSeconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inturn.worker.hl7.errors import HeaderError
from inturn.worker.hl7.header import parse_header
from inturn.worker.hl7.terminators import normalise_terminators
from inturn.worker.senders import shape
from inturn.worker.senders.base import DeliveryError, FailureCause
from inturn.worker.senders.kind import SecretFile, SenderConfig, SenderKind
from inturn.worker.spec.openapi import DNS_SUBDOMAIN, SECRET_KEY, Rule, Schema, integer, obj, string

if TYPE_CHECKING:
    import asyncssh

DEFAULT_PORT = 22
DEFAULT_DIRECTORY = "."
DEFAULT_FILE_NAME = "{controlId}-{id}.hl7"
DEFAULT_KNOWN_HOSTS_KEY = "known_hosts"
#: Bound of connecting and logging in, seconds (the attempt as a whole is bounded by
#: ``retry.timeoutSeconds``).
DEFAULT_TIMEOUT_SECONDS = 15
#: Longest control ID kept in a file name, in characters.
CONTROL_ID_MAX_CHARS = 64

_NAME_PART = r"[A-Za-z0-9._-]"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

RULE_ONE_CREDENTIAL = Rule(
    cel="has(self.privateKeyKey) != has(self.passwordKey)",
    message="exactly one of privateKeyKey and passwordKey must be set",
    check=lambda node: ("privateKeyKey" in node) != ("passwordKey" in node),
)
RULE_NAMES_THE_MESSAGE = Rule(
    cel="self.fileName.contains('{id}') || self.fileName.contains('{controlId}')",
    message="fileName must contain {id} or {controlId}, so that each message has its own file",
    check=lambda node: "{id}" in node["fileName"] or "{controlId}" in node["fileName"],
)
RULE_TEMPORARY_NAME = Rule(
    cel=(
        "!has(self.temporaryName) || (self.temporaryName.contains('{name}')"
        " && self.temporaryName != '{name}')"
    ),
    message="temporaryName must contain {name} and differ from it, e.g. .{name}.part",
    check=lambda node: (
        "temporaryName" not in node
        or ("{name}" in node["temporaryName"] and node["temporaryName"] != "{name}")
    ),
)


def file_name(pattern: str, control_id: str, item_id: int) -> str:
    """The file name of a message: ``pattern`` with ``{controlId}`` (MSH-10, characters other
    than letters, digits, ``.``, ``_`` and ``-`` replaced by ``_``, at most 64) and ``{id}``
    (the queue item id) filled in.

    Raises:
        ValueError: the pattern names ``{controlId}`` and ``control_id`` is empty.
    """
    if "{controlId}" in pattern and not control_id:
        raise ValueError("the message has no readable MSH-10 to name its file")
    safe = _UNSAFE.sub("_", control_id[:CONTROL_ID_MAX_CHARS])
    if safe.startswith("."):
        safe = "_" + safe[1:]
    return pattern.replace("{controlId}", safe).replace("{id}", str(item_id))


@dataclass(frozen=True)
class SftpSenderConfig(SenderConfig):
    """An SFTP server and where each message's file goes.

    Attributes:
        host, port: the server (port 1-65535).
        username: the SSH user.
        known_hosts_file: OpenSSH ``known_hosts`` file the server's host key must be in.
        private_key_file, password_file: the client's credential (exactly one; a password file
            holds the password, a trailing newline ignored).
        directory: remote directory of the files.
        file_name: pattern of a file's name (``{controlId}``, ``{id}``).
        temporary_name: pattern of the name written first (``{name}`` is the final name), then
            renamed; None writes the final name directly.
        timeout_seconds: bound of connecting and logging in.
    """

    host: str
    username: str
    known_hosts_file: str
    port: int = DEFAULT_PORT
    private_key_file: str | None = None
    password_file: str | None = None
    directory: str = DEFAULT_DIRECTORY
    file_name: str = DEFAULT_FILE_NAME
    temporary_name: str | None = None
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS


class SftpSender:
    """Implements :class:`inturn.worker.senders.base.Sender` by writing one file per message.

    Failures raise :class:`DeliveryError` with cause

    * ``rejected``: the final file exists already, the server refused the write or rename
      (permission, no such directory, disk full);
    * ``unsendable``: the message has no MSH-10 to name its file (no retry can help);
    * ``unreachable``: connecting, the host key check or logging in failed, or took longer than
      ``timeout_seconds`` (nothing was written: the queue is held, see
      :func:`inturn.worker.drain.retry.decide`);
    * ``connection``: the connection was lost while the file was being written.
    """

    def __init__(self, config: SftpSenderConfig) -> None:
        self.config = config
        self._conn: asyncssh.SSHClientConnection | None = None
        self._sftp: asyncssh.SFTPClient | None = None
        #: Connections opened so far (for tests and diagnostics).
        self.connections_opened = 0
        #: The last send was logged in and began writing (see
        #: :class:`~inturn.worker.senders.base.Sender`).
        self.written = False

    def describe(self) -> str:
        """``sftp://user@host:port/directory`` (no credentials)."""
        return KIND.summary(
            {
                "host": self.config.host,
                "port": self.config.port,
                "username": self.config.username,
                "directory": self.config.directory,
            }
        )

    async def probe(self) -> bool:
        """Whether the SFTP server accepts a connection now: TCP to its host and port and its
        SSH identification line (RFC 4253 section 4.2), no login and nothing written (a
        connection already open counts). Bound it with a timeout."""
        if self._conn is not None and not self._conn.is_closed():
            return True
        try:
            reader, writer = await asyncio.open_connection(self.config.host, self.config.port)
        except OSError:
            return False
        try:
            line = await reader.readline()
        except OSError:
            line = b""
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        return line.startswith(b"SSH-")

    async def _client(self) -> asyncssh.SFTPClient:
        import asyncssh

        if self._sftp is not None:
            return self._sftp
        cfg = self.config
        credential: dict[str, Any]
        if cfg.password_file is not None:
            password = Path(cfg.password_file).read_text(encoding="utf-8").rstrip("\r\n")
            credential = {"password": password, "client_keys": None}
        else:
            credential = {"client_keys": [cfg.private_key_file], "password": None}
        async with asyncio.timeout(cfg.timeout_seconds):
            conn = await asyncssh.connect(
                cfg.host,
                cfg.port,
                username=cfg.username,
                known_hosts=cfg.known_hosts_file,
                config=None,
                agent_path=None,
                keepalive_interval=30,
                **credential,
            )
            self.connections_opened += 1
            try:
                self._sftp = await conn.start_sftp_client()
            except BaseException:
                conn.close()
                raise
        self._conn = conn
        return self._sftp

    async def send(self, payload: bytes, *, item_id: int = 0) -> None:
        """Write ``payload`` (terminators normalised, as every sender sends it) as one file.

        Raises:
            DeliveryError: see the class docstring.
        """
        import asyncssh

        try:
            control_id = parse_header(payload).control_id.strip()
        except HeaderError:
            control_id = ""
        try:
            name = file_name(self.config.file_name, control_id, item_id)
        except ValueError as exc:
            raise DeliveryError("unsendable", str(exc)) from None
        final = posixpath.join(self.config.directory, name)
        self.written = False
        try:
            sftp = await self._client()
            self.written = True
            await self._write(sftp, final, name, normalise_terminators(payload))
        except DeliveryError:
            await self.close()
            raise
        except TimeoutError:
            await self.close()
            raise DeliveryError(
                "unreachable", f"not logged in within {self.config.timeout_seconds}s"
            ) from None
        except asyncssh.SFTPError as exc:
            await self.close()
            raise DeliveryError("rejected", f"{exc.reason or type(exc).__name__}") from None
        except (asyncssh.Error, OSError) as exc:
            await self.close()
            text = getattr(exc, "reason", "") or str(exc) or type(exc).__name__
            cause: FailureCause = "connection" if self.written else "unreachable"
            raise DeliveryError(cause, f"{type(exc).__name__}: {text}") from None
        except BaseException:
            await self.close()
            raise

    async def _write(self, sftp: asyncssh.SFTPClient, final: str, name: str, data: bytes) -> None:
        if await sftp.exists(final):
            raise DeliveryError("rejected", f"{final} exists already (not overwritten)")
        if self.config.temporary_name is None:
            async with sftp.open(final, "xb") as handle:  # exclusive create
                await handle.write(data)
            return
        temporary = posixpath.join(
            self.config.directory, self.config.temporary_name.replace("{name}", name)
        )
        async with sftp.open(temporary, "wb") as handle:  # ours: left over from a failed try
            await handle.write(data)
        await sftp.rename(temporary, final)  # refuses an existing target

    async def close(self) -> None:
        """Close the SFTP session and the SSH connection, if open."""
        sftp, conn = self._sftp, self._conn
        self._sftp = self._conn = None
        if sftp is not None:
            sftp.exit()
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                await conn.wait_closed()


# --- the kind: spec.sender.sftp ---------------------------------------------------------------


class SftpKind(SenderKind[SftpSenderConfig]):
    """``spec.sender.sftp``: one file per message on an SFTP server (:class:`SftpSender`)."""

    name = "sftp"
    config_type = SftpSenderConfig

    @staticmethod
    def _node(credentials: Mapping[str, Schema], required: tuple[str, ...]) -> Schema:
        return obj(
            {
                "host": string(
                    "Host name or IP address of the server.",
                    max_length=253,
                    min_length=1,
                    pattern=shape.HOST_PATTERN,
                ),
                "port": integer(
                    "TCP port of the server.", minimum=1, maximum=65535, default=DEFAULT_PORT
                ),
                "username": string("The SSH user name.", max_length=256, min_length=1),
                **credentials,
                "directory": string(
                    "Remote directory the files are written in.",
                    max_length=1024,
                    min_length=1,
                    default=DEFAULT_DIRECTORY,
                ),
                "fileName": string(
                    "Name of a message's file: {controlId} (MSH-10, unsafe characters as _)"
                    " and {id} (the queue item id) are filled in.",
                    max_length=255,
                    min_length=1,
                    pattern=rf"^({_NAME_PART}|\{{id\}}|\{{controlId\}})+$",
                    default=DEFAULT_FILE_NAME,
                ),
                "temporaryName": string(
                    "Name written first and then renamed to the file's name, so that a reader"
                    " never sees half a file; {name} is the file's name, e.g. .{name}.part."
                    " Without it the file is written under its name directly.",
                    max_length=255,
                    min_length=1,
                    pattern=rf"^({_NAME_PART}|\{{name\}})+$",
                ),
                "timeoutSeconds": integer(
                    "Bound of connecting and logging in, in seconds.",
                    minimum=1,
                    maximum=600,
                    default=DEFAULT_TIMEOUT_SECONDS,
                ),
            },
            required=("host", "username", *required),
            description=(
                "Deliver each message as one file on an SFTP server (SSH File Transfer"
                " Protocol). An existing file of the same name is an error, never overwritten."
            ),
            rules=(RULE_NAMES_THE_MESSAGE, RULE_TEMPORARY_NAME),
        )

    def spec_schema(self) -> Schema:
        """Server, user, the credential Secret by reference, directory and file names."""
        secret_ref = obj(
            {
                "name": string(
                    "Name of a Secret in the Destination's namespace; mounted into the worker.",
                    max_length=253,
                    min_length=1,
                    pattern=DNS_SUBDOMAIN,
                ),
                "knownHostsKey": string(
                    "Key of an OpenSSH known_hosts file naming the server's host key"
                    " (required: a host key is never trusted on first use).",
                    max_length=253,
                    min_length=1,
                    pattern=SECRET_KEY,
                    default=DEFAULT_KNOWN_HOSTS_KEY,
                ),
                "privateKeyKey": string(
                    "Key of the client's private key (OpenSSH or PEM, unencrypted).",
                    max_length=253,
                    min_length=1,
                    pattern=SECRET_KEY,
                ),
                "passwordKey": string(
                    "Key of the password.", max_length=253, min_length=1, pattern=SECRET_KEY
                ),
            },
            required=("name",),
            description=(
                "The Secret holding the server's known host key and the client's private key"
                " or password (exactly one)."
            ),
            rules=(RULE_ONE_CREDENTIAL,),
        )
        return self._node({"secretRef": secret_ref}, ("secretRef",))

    def worker_schema(self) -> Schema:
        """As :meth:`spec_schema`, with the Secret keys as file paths."""
        path = "Path of a mounted Secret key."
        files = {
            "knownHostsFile": string(path, max_length=4096, min_length=1),
            "privateKeyFile": string(path, max_length=4096, min_length=1),
            "passwordFile": string(path, max_length=4096, min_length=1),
        }
        node = self._node(files, ("knownHostsFile",))
        node["x-kubernetes-validations"] = [
            *node["x-kubernetes-validations"],
            RULE_ONE_FILE.as_cel(),
        ]
        return node

    def render(self, spec: Mapping[str, Any], secret_file: SecretFile) -> dict[str, Any]:
        """The server and names as they are; the Secret's keys as paths."""
        ref = spec["secretRef"]
        out = {k: v for k, v in spec.items() if k != "secretRef"}
        out["knownHostsFile"] = secret_file(
            ref["name"], ref.get("knownHostsKey", DEFAULT_KNOWN_HOSTS_KEY)
        )
        if "privateKeyKey" in ref:
            out["privateKeyFile"] = secret_file(ref["name"], ref["privateKeyKey"])
        if "passwordKey" in ref:
            out["passwordFile"] = secret_file(ref["name"], ref["passwordKey"])
        return out

    def from_dict(self, doc: Mapping[str, Any]) -> SftpSenderConfig:
        """The configuration of a rendered ``sftp`` node."""
        return SftpSenderConfig(
            host=doc["host"],
            port=int(doc.get("port", DEFAULT_PORT)),
            username=doc["username"],
            known_hosts_file=doc["knownHostsFile"],
            private_key_file=doc.get("privateKeyFile"),
            password_file=doc.get("passwordFile"),
            directory=doc.get("directory", DEFAULT_DIRECTORY),
            file_name=doc.get("fileName", DEFAULT_FILE_NAME),
            temporary_name=doc.get("temporaryName"),
            timeout_seconds=int(doc.get("timeoutSeconds", DEFAULT_TIMEOUT_SECONDS)),
        )

    def to_dict(self, config: SftpSenderConfig) -> dict[str, Any]:
        """The rendered ``sftp`` node of ``config``."""
        out: dict[str, Any] = {
            "host": config.host,
            "port": config.port,
            "username": config.username,
            "knownHostsFile": config.known_hosts_file,
            "directory": config.directory,
            "fileName": config.file_name,
            "timeoutSeconds": config.timeout_seconds,
        }
        for key, value in (
            ("privateKeyFile", config.private_key_file),
            ("passwordFile", config.password_file),
            ("temporaryName", config.temporary_name),
        ):
            if value is not None:
                out[key] = value
        return out

    def secret_keys(self, spec: Mapping[str, Any]) -> dict[str, set[str]]:
        """The known-hosts key and the private key or password key of the one Secret."""
        ref = spec["secretRef"]
        keys = {ref.get("knownHostsKey", DEFAULT_KNOWN_HOSTS_KEY)}
        keys.update(ref[k] for k in ("privateKeyKey", "passwordKey") if k in ref)
        return {ref["name"]: keys}

    def summary(self, spec: Mapping[str, Any]) -> str:
        """``sftp://user@host:port/directory`` (``/~/directory`` when relative to the home)."""
        directory = str(spec.get("directory", DEFAULT_DIRECTORY))
        # a relative directory is relative to the user's home: /~/dir (as in SFTP URIs)
        path = directory if directory.startswith("/") else "/~/" + directory.lstrip("./")
        return (
            f"sftp://{spec.get('username')}@{spec.get('host')}:"
            f"{spec.get('port', DEFAULT_PORT)}{path}"
        )[:2048]

    def files(self, config: SftpSenderConfig) -> Iterable[str]:
        """The known-hosts file and the private key or password file."""
        return [
            p
            for p in (config.known_hosts_file, config.private_key_file, config.password_file)
            if p is not None
        ]

    def secret_files(self, config: SftpSenderConfig) -> Iterable[str]:
        """The private key or the password file."""
        return [p for p in (config.private_key_file, config.password_file) if p is not None]

    def problems(self, node: Mapping[str, Any]) -> list[str]:
        """The host (IDNA, labels, NUL), and no control character in the user name or the
        directory (:mod:`inturn.worker.senders.shape`)."""
        return [
            *shape.field("host", shape.host_problem(node.get("host"))),
            *shape.field("username", shape.text_problem(node.get("username"))),
            *shape.field("directory", shape.text_problem(node.get("directory", "."))),
        ]

    def build(self, config: SftpSenderConfig) -> SftpSender:
        """An :class:`SftpSender` (it connects at the first send).

        Raises:
            ValueError: :meth:`problems` finds one.
        """
        self.refuse_shape(config)
        return SftpSender(config)


RULE_ONE_FILE = Rule(
    cel="has(self.privateKeyFile) != has(self.passwordFile)",
    message="exactly one of privateKeyFile and passwordFile must be set",
    check=lambda node: ("privateKeyFile" in node) != ("passwordFile" in node),
)

KIND = SftpKind()
