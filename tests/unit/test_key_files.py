"""Key files are kept like keys (issue 41, part 5): a master key, a TLS or SFTP private key, a
password, a CSRF secret or an HTTP sender's credentials file that other users may read is
refused in one line naming the file and its mode; the rule is libpq's (0600 for your own
file, 0640 for root's, the mode Kubernetes mounts a Secret with under an fsGroup)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
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
