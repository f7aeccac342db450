"""What a sender would refuse at send time is refused when the manifest is read (issue 27, item 5).

Each shape below is one that a transport library refuses with an exception of its own when the
first message goes out (aiohttp's "Forbidden control character detected in headers", the IDNA
codec's "label empty or too long", ``ssl``'s refusal of a server name). For each: the manifest's
validation (what the operator and ``inturn local`` run) names the field, the rendered worker
configuration is refused the same way, and the kind's constructor refuses it too: one function
decides all three.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from inturn.worker.senders import registry
from inturn.worker.senders.http import HttpSenderConfig
from inturn.worker.spec.destination import (
    ManifestError,
    load_worker_config,
    validate_manifest,
)
from inturn.worker.spec.validation import apply_defaults
from tests.support.manifests import destination

BASE = destination()
SFTP_REF = {"name": "sftp", "knownHostsKey": "known_hosts", "privateKeyKey": "id"}


def manifest(sender: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"]["sender"] = sender
    return doc


def http(**node: Any) -> dict[str, Any]:
    return {"http": {"url": "https://lab.example/hl7", **node}}


def mllp(**node: Any) -> dict[str, Any]:
    return {"mllp": {"host": "lab.example", "port": 2575, **node}}


def sftp(**node: Any) -> dict[str, Any]:
    return {"sftp": {"host": "files.example", "username": "drop", "secretRef": SFTP_REF, **node}}


BAD: list[tuple[dict[str, Any], str]] = [
    # header values aiohttp refuses at send time
    (http(headers={"X-Tenant": "a\r\nX-Injected: 1"}), "spec.sender.http.headers"),
    (http(headers={"X-Tenant": "a\nb"}), "spec.sender.http.headers"),
    (http(headers={"X-Tenant": "a\rb"}), "spec.sender.http.headers"),
    (http(headers={"X-Tenant": "a\x00b"}), "spec.sender.http.headers"),
    (http(headers={"X-Tenant": "a\x7fb"}), "spec.sender.http.headers"),
    (http(headers={"X-Tenant": "a\x0bb"}), "spec.sender.http.headers"),
    # header names that are not HTTP tokens, or that the sender writes itself
    (http(headers={"X Tenant": "a"}), "spec.sender.http.headers: a header name"),
    (http(headers={"X-Tenant:": "a"}), "spec.sender.http.headers: a header name"),
    (http(headers={"": "a"}), "spec.sender.http.headers: a header name"),
    (http(headers={"X-Ténant": "a"}), "spec.sender.http.headers: a header name"),
    (http(headers={"X\r\nA": "a"}), "spec.sender.http.headers: a header name"),
    (http(headers={"Content-Length": "0"}), "spec.sender.http.headers.Content-Length"),
    (http(headers={"transfer-encoding": "chunked"}), "spec.sender.http.headers.transfer-encoding"),
    (http(headers={"HOST": "elsewhere"}), "spec.sender.http.headers.HOST"),
    # URLs yarl or the resolver refuses
    (http(url="http://lab.example:0/"), "spec.sender.http.url"),
    (http(url="http://lab.example:99999/"), "spec.sender.http.url"),
    (http(url="http://lab.example:port/"), "spec.sender.http.url"),
    (http(url="http://[::1/x"), "spec.sender.http.url"),
    (http(url="http://a..b/x"), "spec.sender.http.url"),
    (http(url=f"http://{'x' * 64}.example/"), "spec.sender.http.url"),
    (http(url="http://:80/x"), "spec.sender.http.url"),
    # hosts the IDNA codec or the resolver refuses with an exception
    (mllp(host="a..b"), "spec.sender.mllp.host"),
    (mllp(host=".lab"), "spec.sender.mllp.host"),
    (mllp(host="x" * 64), "spec.sender.mllp.host"),
    (mllp(host="lab\x00.example"), "spec.sender.mllp.host"),
    (mllp(host="lab\u2028example"), "spec.sender.mllp.host"),
    (mllp(host="lab example"), "spec.sender.mllp.host"),
    (sftp(host="a..b"), "spec.sender.sftp.host"),
    (sftp(username="drop\nroot"), "spec.sender.sftp.username"),
    (sftp(directory="/in\x00"), "spec.sender.sftp.directory"),
    # TLS server names ssl refuses
    (mllp(tls={"serverName": ".lab.example"}), "spec.sender.mllp.tls.serverName"),
    (mllp(tls={"serverName": "a..b"}), "spec.sender.mllp.tls.serverName"),
    (http(tls={"serverName": "x" * 64}), "spec.sender.http.tls.serverName"),
]

GOOD: list[dict[str, Any]] = [
    http(headers={"X-Tenant": "a\tb", "Authorization": "Bearer abc", "x-a_b.c~": "é"}),
    http(url="http://[::1]:8080/hl7?x=1"),
    http(url="https://127.0.0.1/"),
    http(url="https://lab.example./in"),
    http(url="http://ünï.example/x"),
    mllp(host="::1"),
    mllp(host="lab_1.svc.cluster.local"),
    mllp(host="ünï.example"),
    mllp(host="lab.example."),
    mllp(tls={"serverName": "lab.example"}),
    sftp(directory="in/ünï"),
]


@pytest.mark.parametrize(("sender", "where"), BAD, ids=lambda v: repr(v)[:60])
def test_the_manifest_refuses_what_the_sender_would(sender: dict[str, Any], where: str) -> None:
    with pytest.raises(ManifestError) as info:
        validate_manifest(manifest(sender))
    assert any(e.startswith(where) for e in info.value.errors), info.value.errors
    for line in info.value.errors:  # one line each: a value shown has its controls escaped
        assert "\r" not in line and "\n" not in line and "\x00" not in line


@pytest.mark.parametrize(("sender", "where"), BAD, ids=lambda v: repr(v)[:60])
def test_the_kind_refuses_to_build_the_same(sender: dict[str, Any], where: str) -> None:
    kind, node = registry.of_spec(sender) or (None, None)
    assert kind is not None and node is not None
    node = apply_defaults(kind.spec_schema(), node)
    rendered = kind.render(node, lambda secret, key: f"/secrets/{secret}/{key}")
    problems = registry.problems({kind.name: rendered}, "sender")
    assert any(p.startswith(where.removeprefix("spec.")) for p in problems), problems
    with pytest.raises(ValueError):
        kind.build(kind.from_dict(rendered))


@pytest.mark.parametrize("sender", GOOD, ids=lambda v: repr(v)[:60])
def test_what_a_sender_can_use_passes(sender: dict[str, Any]) -> None:
    validate_manifest(manifest(sender))
    kind, node = registry.of_spec(sender) or (None, None)
    assert kind is not None and node is not None
    assert kind.problems(node) == []


def test_a_rendered_worker_configuration_is_checked_alike() -> None:
    doc = {
        "destination": "ward/lis",
        "channel": "adt",
        "sender": {"http": {"url": "https://lab.example/", "headers": {"X": "a\r\nb"}}},
    }
    with pytest.raises(ManifestError, match=r"sender\.http\.headers"):
        load_worker_config(doc)


def test_the_refusal_is_said_in_words() -> None:
    with pytest.raises(ManifestError) as info:
        validate_manifest(manifest(http(headers={"X-Tenant": "a\r\nX-Evil: 1"})))
    assert info.value.errors == (
        "spec.sender.http.headers.X-Tenant: must not contain control characters (CR, LF, NUL, ...)",
    )
    with pytest.raises(ManifestError) as info:
        validate_manifest(manifest(http(headers={"Bad Name": "x"})))
    assert info.value.errors == (
        "spec.sender.http.headers: a header name is not an HTTP field name"
        " (letters, digits and !#$%&'*+-.^_`|~ only)",
    )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("X-Tenant: a\x00b\n", "X-Tenant: the value must not contain control characters"),
        ("X-Tenant: a\x7fb\n", "X-Tenant: the value must not contain control characters"),
        ("Bad Name: x\n", "a header name is not an HTTP field name"),
        ("Content-Length: 5\n", "Content-Length: is set by the sender itself"),
        ("no colon\n", ":1: expected 'Name: value'"),
    ],
    ids=["nul", "del", "bad-name", "framing", "no-colon"],
)
def test_a_headers_file_the_sender_would_refuse_stops_it_at_start(
    tmp_path: Path, text: str, words: str
) -> None:
    """The headers file is a Secret's content (the operator never reads it): checked when the
    worker or inturn local starts, by the function every send reads it with."""
    path = tmp_path / "headers"
    path.write_text("Authorization: Bearer s3cret\n" + text if "colon" not in text else text)
    path.chmod(0o600)
    config = HttpSenderConfig("https://lab.example/", headers_file=str(path))
    problems = registry.check(config)
    assert len(problems) == 1 and words in problems[0], problems
    assert "s3cret" not in problems[0] and "a\x00b" not in problems[0]
