"""A real SFTP server in the test process (asyncssh), chrooted to a directory of its own.

It authenticates clients by public key and by password, and hands out the files a Destination
needs: ``secrets/<secret>/known_hosts`` with its host key, the client's ``id_ed25519`` and a
``password``, laid out as the operator would mount them.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

import asyncssh

USER = "partner"
PASSWORD = "s3cret-pass"


class _Server(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return True

    def validate_password(self, username: str, password: str) -> bool:
        return username == USER and password == PASSWORD


class SftpServer:
    """``async with SftpServer(tmp_path) as server``: listens on a free port of 127.0.0.1.

    Attributes:
        root: the directory clients see as ``/`` (files land under ``root / "inbox"``).
        secrets: the Secret directory to pass as ``--secrets-dir`` (Secret ``sftp-partner``).
    """

    def __init__(self, base: Path, secret: str = "sftp-partner") -> None:
        self.root = base / "sftp-root"
        (self.root / "inbox").mkdir(parents=True, exist_ok=True)
        self.secrets = base / "secrets"
        self.secret_dir = self.secrets / secret
        self.secret_dir.mkdir(parents=True, exist_ok=True)
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key = asyncssh.generate_private_key("ssh-ed25519")
        self._acceptor: Any = None
        self.port = 0

    @property
    def inbox(self) -> Path:
        """Where the client's ``/inbox`` is on this machine."""
        return self.root / "inbox"

    def files(self) -> list[str]:
        """Names in the inbox, sorted."""
        return sorted(p.name for p in self.inbox.iterdir())

    async def __aenter__(self) -> SftpServer:
        authorized = asyncssh.import_authorized_keys(self.client_key.export_public_key().decode())
        root = str(self.root).encode()
        self._acceptor = await asyncssh.listen(
            "127.0.0.1",
            0,
            server_factory=_Server,
            server_host_keys=[self.host_key],
            authorized_client_keys=authorized,
            sftp_factory=lambda chan: asyncssh.SFTPServer(chan, chroot=root),
            allow_scp=False,
        )
        self.port = int(self._acceptor.sockets[0].getsockname()[1])
        public = self.host_key.export_public_key().decode().strip()
        (self.secret_dir / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {public}\n")
        (self.secret_dir / "id_ed25519").write_bytes(self.client_key.export_private_key("openssh"))
        (self.secret_dir / "password").write_text(PASSWORD + "\n")
        # secrets are kept like keys (inturn refuses a key file other users may read)
        (self.secret_dir / "id_ed25519").chmod(0o600)
        (self.secret_dir / "password").chmod(0o600)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._acceptor.close()
        await self._acceptor.wait_closed()
