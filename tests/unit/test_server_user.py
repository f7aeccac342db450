"""The embedded server's system user is made once, however many processes start at once."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None, reason="needs root and useradd"
)

RACER = """
import sys
from pathlib import Path
from inturn.worker.local.embedded import ensure_server_user
ensure_server_user(Path(sys.argv[1]), sys.argv[2])
"""


def test_processes_racing_to_make_the_user_agree_on_one(tmp_path: Path) -> None:
    """Six processes started together each ensure a user that does not exist yet: every one
    succeeds and the password file ends with exactly one entry for it, whose uid is what each
    of them then sees (pgserver's own check-then-useradd raced on a fresh machine: one data
    folder went to a uid replaced a moment later)."""
    user = f"it{uuid.uuid4().hex[:10]}"
    try:
        racers = [
            subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), user]) for _ in range(6)
        ]
        codes = [racer.wait(timeout=60) for racer in racers]
        assert codes == [0] * 6
        lines = [
            line
            for line in Path("/etc/passwd").read_text().splitlines()
            if line.split(":")[0] == user
        ]
        assert len(lines) == 1
        assert int(lines[0].split(":")[2]) == pwd.getpwnam(user).pw_uid
    finally:
        subprocess.run(["userdel", user], capture_output=True, timeout=60, check=False)


def test_an_existing_user_is_left_alone(tmp_path: Path) -> None:
    """A user already there (root here) is found under the lock and nothing is run."""
    before = Path("/etc/passwd").read_text()
    from inturn.worker.local.embedded import ensure_server_user

    ensure_server_user(tmp_path, "root")
    assert Path("/etc/passwd").read_text() == before
    assert (tmp_path / "inturn-pgserver-user.lock").exists()
