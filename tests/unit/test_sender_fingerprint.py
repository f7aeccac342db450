"""Kind 8 (pure part): the sender fingerprint changes exactly when the sender settings do."""

from __future__ import annotations

from pathlib import Path

import pytest

from inturn.worker.senders.fingerprint import fingerprint
from inturn.worker.senders.http import HttpSenderConfig
from inturn.worker.senders.mllp import MllpSenderConfig
from inturn.worker.senders.tls import TlsConfig

BASE = MllpSenderConfig("lab.example", 2575)


def test_same_settings_same_fingerprint() -> None:
    assert fingerprint(BASE) == fingerprint(MllpSenderConfig("lab.example", 2575))
    assert len(fingerprint(BASE)) == 64


@pytest.mark.parametrize(
    "changed",
    [
        MllpSenderConfig("lab.example", 2576),  # port
        MllpSenderConfig("lis.example", 2575),  # host
        MllpSenderConfig("lab.example", 2575, tls=TlsConfig()),  # TLS on
        MllpSenderConfig("lab.example", 2575, tls=TlsConfig(server_name="x")),
        MllpSenderConfig("lab.example", 2575, always_wait_for_ack=True),
        HttpSenderConfig("http://lab.example:2575/"),  # another kind
    ],
)
def test_any_setting_changes_it(changed: object) -> None:
    assert fingerprint(changed) != fingerprint(BASE)  # type: ignore[arg-type]


def test_headers_and_file_contents_count(tmp_path: Path) -> None:
    headers = tmp_path / "headers"
    headers.write_text("Authorization: Bearer one\n")
    http = HttpSenderConfig("https://x.example/in", headers={"X-A": "1"}, headers_file=str(headers))
    first = fingerprint(http)
    assert fingerprint(HttpSenderConfig("https://x.example/in", headers={"X-A": "2"})) != first
    headers.write_text("Authorization: Bearer two\n")  # a rotated credential, same path
    assert fingerprint(http) != first
    assert "Bearer" not in fingerprint(http)
    headers.unlink()
    assert fingerprint(http) != first  # unreadable: still a fingerprint
