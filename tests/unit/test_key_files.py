"""Key files are kept like keys (issue 41, part 5): a master key, a TLS or SFTP private key, a
password, a CSRF secret or an HTTP sender's credentials file that other users may read is
refused in one line naming the file and its mode; the rule is libpq's (0600 for your own
file, 0640 for root's, the mode Kubernetes mounts a Secret with under an fsGroup)."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from inturn.worker.crypto.keyfiles import ALLOW_ENV, KeyFileExposed, check_key_file
from inturn.worker.crypto.masterkeys import FileKeyProvider
from inturn.worker.senders.registry import of_config
from inturn.worker.senders.sftp import SftpSenderConfig

KEY = os.urandom(32)
ROOT = os.geteuid() == 0


def key_file(folder: Path, mode: int, name: str = "k1") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(KEY)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o666, 0o660, 0o620, 0o607, 0o650])
def test_a_master_key_others_may_read_or_change_is_refused(tmp_path: Path, mode: int) -> None:
    path = key_file(tmp_path / "keys", mode)
    with pytest.raises(KeyFileExposed) as caught:
        FileKeyProvider(tmp_path / "keys")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"--payload-keys: {path} has mode {mode:04o}")
    assert ALLOW_ENV in message


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_private_master_key_is_used(tmp_path: Path, mode: int) -> None:
    key_file(tmp_path / "keys", mode)
    assert FileKeyProvider(tmp_path / "keys").ids() == ("k1",)


@pytest.mark.skipif(not ROOT, reason="the group-read allowance is for files owned by root")
@pytest.mark.parametrize("mode", [0o440, 0o640])
def test_a_root_owned_key_its_group_may_read_is_used(tmp_path: Path, mode: int) -> None:
    """A Secret volume under an fsGroup: root's file, read by the pod's group (the chart's
    defaultMode 0440)."""
    key_file(tmp_path / "keys", mode)
    assert FileKeyProvider(tmp_path / "keys").ids() == ("k1",)


@pytest.mark.skipif(not ROOT, reason="needs root to give a file to another user")
def test_a_key_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = key_file(tmp_path / "keys", 0o600)
    os.chown(path, 4242, 4242)
    with pytest.raises(KeyFileExposed, match=r"owner uid 4242.*chown it"):
        check_key_file(path, "--payload-keys")


def test_a_symbolic_link_is_judged_by_its_target(tmp_path: Path) -> None:
    """A Secret volume's key is a link into ..data: the file it points at is what counts."""
    target = key_file(tmp_path / "..data", 0o644)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "k1").symlink_to(target)
    with pytest.raises(KeyFileExposed, match="mode 0644"):
        FileKeyProvider(tmp_path / "keys")
    target.chmod(0o600)
    assert FileKeyProvider(tmp_path / "keys").ids() == ("k1",)


def test_the_explicit_allowance_uses_the_file_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    key_file(tmp_path / "keys", 0o644)
    monkeypatch.setenv(ALLOW_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="inturn.crypto"):
        assert FileKeyProvider(tmp_path / "keys").ids() == ("k1",)
    assert any("mode 0644" in r.getMessage() for r in caplog.records)


def test_the_command_line_answers_one_line(tmp_path: Path) -> None:
    key_file(tmp_path / "keys", 0o644)
    run = subprocess.run(
        [
            str(Path(sys.executable).with_name("inturn")),
            "keys",
            "status",
            "--key-dsn",
            "postgresql://127.0.0.1:9/none",
            "--payload-keys",
            str(tmp_path / "keys"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode in (1, 2)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    assert "has mode 0644" in lines[0] and "Traceback" not in run.stderr


def test_a_sender_refuses_a_private_key_others_may_read(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("not really a key\n")
    key.chmod(0o644)
    known = tmp_path / "known_hosts"
    known.write_text("[127.0.0.1]:2222 ssh-ed25519 AAAA\n")
    config = SftpSenderConfig(
        host="127.0.0.1",
        port=2222,
        username="inturn",
        directory="in",
        known_hosts_file=str(known),
        private_key_file=str(key),
    )
    problems = of_config(config).check(config)
    assert len(problems) == 1
    assert problems[0].startswith(f"sender: {key} has mode 0644")


def test_a_csrf_secret_others_may_read_is_refused(tmp_path: Path) -> None:
    import click

    from inturn.worker.cli.console import read_secret

    secret = tmp_path / "csrf"
    secret.write_text("s" * 32)
    secret.chmod(0o644)
    with pytest.raises(click.ClickException, match=r"--csrf-secret-file: .* has mode 0644"):
        read_secret(secret)
    secret.chmod(0o600)
    assert read_secret(secret) == b"s" * 32


@pytest.mark.parametrize("mode", [0o644, 0o660, 0o604])
def test_a_file_of_tokens_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    """Ingest's credentials and the console's auth file may list bearer tokens in clear: they
    are key files too."""
    from inturn.worker.console.auth import AuthConfigError, load_auth
    from inturn.worker.ingest.credentials import Credentials, CredentialsError

    creds = tmp_path / "credentials.yaml"
    creds.write_text("credentials:\n  - {name: a, channels: [adt], token: " + "t" * 30 + "}\n")
    auth = tmp_path / "auth.yaml"
    auth.write_text("tokens:\n  - {name: a, roles: [viewer], token: " + "t" * 30 + "}\n")
    for path in (creds, auth):
        path.chmod(mode)
    with pytest.raises(CredentialsError, match=rf"--http-credentials: .* has mode {mode:04o}"):
        Credentials.load(creds)
    with pytest.raises(AuthConfigError, match=rf"--auth-file: .* has mode {mode:04o}"):
        load_auth(auth)
    for path in (creds, auth):
        path.chmod(0o600)
    assert Credentials.load(creds).entries[0].name == "a"
    assert load_auth(auth) is not None


def _inturn(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTURN_")}
    return subprocess.run(
        [str(Path(sys.executable).with_name("inturn")), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


@pytest.mark.slow  # whole inturn processes on hostile files: left out by make test-fast
def test_the_commands_refuse_an_open_file_of_tokens_or_key_in_one_line(tmp_path: Path) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text("tokens:\n  - {name: a, roles: [viewer], token: " + "t" * 30 + "}\n")
    auth.chmod(0o644)
    key = tmp_path / "client.key"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    key.chmod(0o640 if not ROOT else 0o604)
    message = tmp_path / "m.hl7"
    message.write_bytes(b"MSH|^~\\&|A|B|C|D|20260101||ADT^A01|1|P|2.5\r")
    for args, says in (
        (["console", "--dsn", "postgresql://127.0.0.1:9/x", "--auth-file", str(auth)], "0644"),
        (
            ["send", "--mllp", "127.0.0.1:9", "--tls", "--key-file", str(key), str(message)],
            f"{key.stat().st_mode & 0o777:04o}",
        ),
    ):
        done = _inturn(*args)
        assert done.returncode in (1, 2), done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and f"has mode {says}" in lines[0], done.stderr


#: A user and groups no one else on the machine has: the pod's runAsUser, its fsGroup (a
#: supplementary group of the process, the group of the Secret's files) and a stranger's group.
POD_UID, FS_GROUP, OTHER_GROUP = 4242, 4343, 4444


@contextlib.contextmanager
def as_pod() -> Iterator[None]:
    """Run the block as Kubernetes runs a non-root pod: effective uid and gid POD_UID, with
    FS_GROUP as a supplementary group; back to root after it."""
    groups = os.getgroups()
    os.setgroups([FS_GROUP])
    os.setegid(POD_UID)
    os.seteuid(POD_UID)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


def _as_pod(path: Path) -> str:
    """The check's answer for ``path`` in a process that runs as a pod's user."""
    with as_pod():
        try:
            check_key_file(path, "key")
        except KeyFileExposed as exc:
            return str(exc)
    return "accepted"


@pytest.mark.skipif(not ROOT, reason="needs root to run a process as a pod's user")
@pytest.mark.parametrize(
    ("owner", "group", "mode", "accepted"),
    [
        (0, FS_GROUP, 0o440, True),  # a Secret volume under fsGroup: the chart's defaultMode
        (0, FS_GROUP, 0o640, True),
        (0, FS_GROUP, 0o400, True),
        (0, OTHER_GROUP, 0o440, False),  # a group the pod is not in: its members could read it
        (0, FS_GROUP, 0o460, False),  # group write
        (0, FS_GROUP, 0o444, False),  # everyone
        (POD_UID, POD_UID, 0o600, True),  # the pod's own file
        (POD_UID, POD_UID, 0o640, False),  # own file, group read: libpq's rule, 0600
        (POD_UID, FS_GROUP, 0o440, False),
        (4545, FS_GROUP, 0o400, False),  # a stranger's file
    ],
)
def test_the_rule_as_a_non_root_pod_sees_it(
    owner: int, group: int, mode: int, accepted: bool
) -> None:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="inturn-keyfile-"))
    try:
        folder.chmod(0o755)  # the pod's user must reach the file (pytest's folders are 0700)
        path = folder / "key"
        path.write_bytes(KEY)
        os.chown(path, owner, group)
        path.chmod(mode)
        answer = _as_pod(path)
    finally:
        for child in folder.iterdir():
            child.unlink()
        folder.rmdir()
    if accepted:
        assert answer == "accepted"
    else:
        assert f"has mode {mode:04o}" in answer, answer
        if owner == 0 and group == OTHER_GROUP:
            assert f"group {OTHER_GROUP}, which is not one of this process's" in answer
