"""Credentials files, bearer parsing, certificate names and allow-lists (pure logic)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from inturn.worker.ingest.access import AllowList, certificate_names, peer_address
from inturn.worker.ingest.credentials import (
    Credentials,
    CredentialsError,
    new_token,
    parse_bearer,
    token_digest,
)

TOKEN = "a-token-of-at-least-24-characters"


def test_credentials_file_round_trip(tmp_path: Path) -> None:
    token, digest = new_token()
    path = tmp_path / "credentials.yaml"
    path.write_text(
        "credentials:\n"
        f"  - {{name: ris, channels: [adt, orders], token: {TOKEN}}}\n"
        f"  - {{name: lab, channels: [lab], tokenSha256: {digest.upper()}}}\n"
        "  - {name: pacs, channels: ['*'], clientCertificate: pacs.example}\n"
    )
    path.chmod(0o600)  # a key file: others may not read it
    creds = Credentials.load(path)
    assert [c.name for c in creds.authenticate(f"Bearer {TOKEN}")] == ["ris"]
    assert [c.name for c in creds.authenticate(f"bearer {token}")] == ["lab"]
    assert creds.authenticate("Bearer nope") == ()
    assert creds.authenticate(None) == ()
    assert [c.name for c in creds.authenticate(None, {"pacs.example"})] == ["pacs"]
    [pacs] = creds.authenticate(None, {"x", "pacs.example"})
    assert pacs.allows("anything") and creds.wants_certificates
    [ris] = creds.authenticate(f"Bearer {TOKEN}", {"unlisted"})
    assert ris.allows("adt") and ris.allows("orders") and not ris.allows("lab")
    # a bad token is not rescued by a good certificate
    assert creds.authenticate("Bearer wrong", {"pacs.example"}) == ()
    # only digests are kept
    assert all(TOKEN not in repr(c) for c in creds.entries)
    assert token_digest(token).hex() == digest


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "list 'credentials'"),
        ({"credentials": [{"channels": ["adt"], "token": TOKEN}]}, "credentials[0].name"),
        ({"credentials": [{"name": "a", "token": TOKEN}]}, "(a).channels"),
        ({"credentials": [{"name": "a", "channels": ["bad name"], "token": TOKEN}]}, "channels"),
        ({"credentials": [{"name": "a", "channels": ["adt"]}]}, "exactly one of"),
        (
            {
                "credentials": [
                    {"name": "a", "channels": ["adt"], "token": TOKEN, "tokenSha256": "0"}
                ]
            },
            "exactly one of",
        ),
        ({"credentials": [{"name": "a", "channels": ["adt"], "token": "short"}]}, "24 characters"),
        ({"credentials": [{"name": "a", "channels": ["adt"], "tokenSha256": "abc"}]}, "64 hex"),
        ({"credentials": [{"name": "a", "channels": ["adt"], "tokn": TOKEN}]}, "unknown field"),
        (
            {"credentials": [{"name": "a", "channels": ["adt"], "token": TOKEN}] * 2},
            "distinct",
        ),
    ],
)
def test_invalid_credentials_name_the_field(data: Any, message: str) -> None:
    with pytest.raises(CredentialsError, match=re.escape(message)):
        Credentials.from_data(data)


def test_unreadable_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match=r"missing\.yaml"):
        Credentials.load(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("credentials: [")
    (tmp_path / "bad.yaml").chmod(0o600)
    with pytest.raises(CredentialsError, match=r"bad\.yaml"):
        Credentials.load(tmp_path / "bad.yaml")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer abc", "abc"),
        ("BEARER  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer ", None),
    ],
)
def test_parse_bearer(header: str | None, token: str | None) -> None:
    assert parse_bearer(header) == token


def test_certificate_names_are_cn_and_san_values() -> None:
    cert = {
        "subject": ((("countryName", "DE"),), (("commonName", "ris"),)),
        "subjectAltName": (
            ("DNS", "ris.example"),
            ("URI", "urn:x"),
            ("IP Address", "10.0.0.5"),
            ("othername", "<unsupported>"),
        ),
    }
    assert certificate_names(cert) == {"ris", "ris.example", "urn:x", "10.0.0.5"}
    assert certificate_names(None) == frozenset() == certificate_names({})


def test_allow_lists() -> None:
    allow = AllowList.build(networks=["10.1.0.0/16", "2001:db8::/32", "192.0.2.7"])
    assert allow.restricts
    assert allow.network_refusal(("10.1.200.3", 5000)) is None
    assert allow.network_refusal(("::ffff:10.1.0.9", 5000, 0, 0)) is None  # v4-mapped
    assert allow.network_refusal(("2001:db8::1", 5000, 0, 0)) is None
    assert allow.network_refusal(("192.0.2.7", 1)) is None
    assert allow.network_refusal(("192.0.2.8", 1)) == "network"
    assert allow.network_refusal(None) == "network"
    assert allow.subject_refusal([]) is None  # no subject list: no certificate needed
    subjects = AllowList.build(subjects=["ris"])
    assert subjects.network_refusal(("8.8.8.8", 1)) is None
    assert subjects.subject_refusal(["ris.example", "ris"]) is None
    assert subjects.subject_refusal(["other"]) == "subject"
    assert subjects.subject_refusal([]) == "subject"
    assert not AllowList().restricts
    with pytest.raises(ValueError, match="CIDR"):
        AllowList.build(networks=["10.1.2.3/16"])
    with pytest.raises(ValueError, match="CIDR"):
        AllowList.build(networks=["example.com"])
    with pytest.raises(ValueError, match="empty"):
        AllowList.build(subjects=[" "])
    assert peer_address(("fe80::1%eth0", 1, 0, 2)) is not None
