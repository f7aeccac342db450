"""The console's pure parts: the overview's rows and order, identities, CSRF tokens, and
how stored text is shown."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime

import pytest
from multidict import CIMultiDict

from inturn.worker.console.auth import AuthConfigError, parse_auth
from inturn.worker.console.csrf import Csrf
from inturn.worker.console.names import ServerNames
from inturn.worker.console.overview import build, error_class
from inturn.worker.console.text import segments
from inturn.worker.store.model import DepthRow, HeadInfo
from inturn.worker.store.registry import Hold, Listed
from inturn.worker.text.display import printable

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def listed(name: str, **changes: object) -> Listed:
    fields: dict[str, object] = {
        "destination": name,
        "channel": "adt",
        "sender": "mllp://x:1",
        "suspended": False,
        "hold": None,
        "deleted": False,
    }
    fields.update(changes)
    return Listed(**fields)  # type: ignore[arg-type]


def depth(
    name: str, pending: int, failed: int = 0, oldest: float = 0.0, attempts: int = 0
) -> DepthRow:
    return DepthRow(name, "adt", pending, failed, NOW if pending else None, oldest, attempts)


def test_rows_worst_first_with_states_and_ready() -> None:
    rows = build(
        [
            listed("a/idle"),
            listed("a/busy"),
            listed("a/stuck"),
            listed("a/held", hold=Hold(NOW, "otto", "upgrade")),
            listed("a/failing"),
            listed("a/gone", deleted=True),
        ],
        [
            depth("a/busy", 5, oldest=10),
            depth("a/stuck", 3, oldest=1000, attempts=4),
            depth("a/held", 2, oldest=20),
            depth("a/failing", 1, failed=2, oldest=30, attempts=1),
            depth("b/orphan", 1, oldest=5),
        ],
        {
            "a/busy": HeadInfo(1, 0, 0.0, None),
            "a/stuck": HeadInfo(2, 4, 7.5, "connection: refused"),
            "a/held": HeadInfo(3, 0, 0.0, None),
            "a/failing": HeadInfo(4, 1, 0.0, "application: AE"),
            "b/orphan": HeadInfo(5, 0, 0.0, None),
        },
        default_stuck_after=900,
    )
    got = [(r.destination, r.state, r.ready, r.severity) for r in rows]
    assert got == [
        ("a/stuck", "stuck", 0, 2),  # over the threshold, backing off: nothing may go
        ("a/failing", "failing", 1, 1),
        ("a/held", "held", 0, 1),
        ("b/orphan", "orphaned", 0, 1),  # pending, but no live registration
        ("a/busy", "delivering", 5, 0),
        ("a/idle", "idle", 0, 0),
    ]
    assert rows[0].last_error_class == "connection" and rows[0].head_wait_seconds == 7.5
    assert rows[2].hold_by == "otto"
    assert "a/gone" not in {r.destination for r in rows}  # deleted and empty: not listed


def test_what_stops_delivery_is_named_before_its_symptoms() -> None:
    """An orphaned queue (its Destination is gone: no worker) with a head that failed before is
    ``orphaned``, not ``failing``; a held or orphaned queue past its threshold says why it is
    stuck, and is still worst (severity 2)."""
    rows = build(
        [listed("a/held", hold=Hold(NOW, "otto", "upgrade")), listed("a/gone", deleted=True)],
        [
            depth("a/gone", 3, failed=1, oldest=30, attempts=5),
            depth("b/orphan", 2, oldest=2000, attempts=2),
            depth("a/held", 2, oldest=2000, attempts=1),
        ],
        {
            "a/gone": HeadInfo(1, 5, 20.0, "connection: refused"),
            "b/orphan": HeadInfo(2, 2, 0.0, "timeout: no answer"),
            "a/held": HeadInfo(3, 1, 0.0, "application: AE"),
        },
        default_stuck_after=900,
    )
    got = {r.destination: (r.state, r.severity, r.ready) for r in rows}
    assert got == {
        "a/gone": ("orphaned", 1, 0),
        "b/orphan": ("orphaned", 2, 0),
        "a/held": ("held", 2, 0),
    }


def test_error_class() -> None:
    assert error_class("timeout: no answer within 30s") == "timeout"
    assert error_class("weird") == "weird"
    assert error_class(None) is None and error_class("") is None


def test_tokens_in_clear_or_as_digests_and_roles() -> None:
    digest = hashlib.sha256(b"second-token-0123456789").hexdigest()
    auth = parse_auth(
        {
            "tokens": [
                {"name": "a", "roles": ["viewer"], "token": "first-token-0123456789"},
                {"name": "b", "roles": ["privacy"], "sha256": digest},
            ]
        }
    )
    a = auth.authenticate({"Authorization": "Bearer first-token-0123456789"}, "10.0.0.1")
    b = auth.authenticate({"Authorization": "bearer second-token-0123456789"}, "10.0.0.1")
    assert a is not None and a.name == "a" and a.can("viewer") and not a.can("operator")
    assert b is not None and b.can("privacy") and b.can("viewer") and not b.can("operator")
    assert auth.authenticate({"Authorization": "Bearer nope"}, "10.0.0.1") is None
    assert auth.authenticate({}, "127.0.0.1") is None


def test_proxy_headers_are_believed_only_from_the_proxy() -> None:
    auth = parse_auth(
        {
            "proxy": {
                "trustedAddresses": ["10.1.0.0/16"],
                "groupRoles": {"oncall": ["operator"]},
            }
        }
    )
    headers = {"X-Forwarded-User": "jane@hospital.example", "X-Forwarded-Groups": "staff,oncall"}
    jane = auth.authenticate(headers, "10.1.2.3")
    assert jane is not None and jane.name == "jane@hospital.example" and jane.can("operator")
    assert auth.authenticate(headers, "10.2.0.1") is None  # not the proxy
    assert auth.authenticate({"X-Forwarded-User": "x\ny"}, "10.1.2.3") is None


@pytest.mark.parametrize(
    "pairs",
    [
        # a proxy that appends its header after the client's: the client's comes first
        [("X-Forwarded-User", "mallory"), ("X-Forwarded-User", "jane")],
        [("X-Forwarded-User", "jane"), ("X-Forwarded-User", "jane")],
        [
            ("X-Forwarded-User", "jane"),
            ("X-Forwarded-Groups", "x"),
            ("x-forwarded-groups", "oncall"),
        ],
        [("X-Forwarded-User", "mallory, jane")],
        [("Authorization", "Bearer x"), ("Authorization", "Bearer y")],
    ],
)
def test_several_values_of_an_identity_header_are_refused(pairs: list[tuple[str, str]]) -> None:
    auth = parse_auth({"proxy": {"trustedAddresses": ["10.1.0.0/16"]}})
    assert auth.authenticate(CIMultiDict(pairs), "10.1.2.3") is None
    one = CIMultiDict([("X-Forwarded-User", "jane")])
    assert auth.authenticate(one, "10.1.2.3") is not None


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ({"tokens": [{"name": "a", "roles": ["root"], "token": "t" * 16}]}, "tokens/0/roles/0"),
        ({"tokens": [{"name": "a", "roles": ["viewer"], "token": "short"}]}, "tokens/0/token"),
        ({"proxy": {"trustedAddresses": ["not-a-net"]}}, "proxy/trustedAddresses"),
        ({"tokenz": []}, "(top)"),
    ],
)
def test_a_bad_auth_file_names_the_field(doc: object, where: str) -> None:
    with pytest.raises(AuthConfigError, match=re.escape(f"auth file: {where}")):
        parse_auth(doc)


def test_csrf_tokens_are_per_identity_and_secret() -> None:
    csrf = Csrf(b"s" * 32)
    assert csrf.valid("otto", csrf.token("otto"))
    assert not csrf.valid("vera", csrf.token("otto"))
    assert not csrf.valid("otto", Csrf(b"t" * 32).token("otto"))
    assert not csrf.valid("otto", None) and not csrf.valid("otto", "")


@pytest.mark.parametrize(
    ("host", "served"),
    [
        ("localhost", True),
        ("localhost:8080", True),
        ("LOCALHOST.:8080", True),
        ("127.0.0.1:1", True),
        ("[::1]:8080", True),
        ("console.example:8443", True),
        ("console.example:8080", False),  # configured with a port: only that one
        ("evil.example", False),  # a rebound name
        ("evil.example:8080", False),
        ("127.0.0.1.evil.example", False),
        ("localhost@evil.example", False),
        ("localhost:80/x", False),
        ("localhost:99999", False),
        ("", False),
        (None, False),
    ],
)
def test_the_console_serves_only_its_names(host: str | None, served: bool) -> None:
    names = ServerNames.parse(["localhost", "127.0.0.1", "::1", "console.example:8443"])
    assert names.serves(host) is served


def test_origin_is_checked_against_the_names_never_the_host() -> None:
    names = ServerNames.parse([])  # the loopback names
    assert names.same_origin(None) and names.same_origin("http://localhost:8080")
    assert names.same_origin("http://[::1]:8080") and names.same_origin("https://127.0.0.1")
    for origin in ("http://evil:8080", "null", "file://localhost", "http://localhost/x", "x"):
        assert not names.same_origin(origin), origin
    with pytest.raises(ValueError, match="not a host name"):
        ServerNames.parse(["http://console.example/"])


def test_control_characters_are_shown_and_segments_split() -> None:
    assert printable("a\x1b[31m\x07b\x85") == "a\\x1b[31m\\x07b\\x85"
    assert segments(b"MSH|^~\\&|A\rPID|1||\x00x\r\nOBX|\xff\n") == [
        "MSH|^~\\&|A",
        "PID|1||\\x00x",
        "OBX|\\xff",
    ]


def test_each_destination_is_stuck_after_its_own_threshold() -> None:
    """spec.alerting.stuckAfterSeconds, the sweeper's threshold, is the console's too; the
    console's default serves queues without a registration."""
    rows = build(
        [listed("a/patient", stuck_after_seconds=3600), listed("a/strict", stuck_after_seconds=60)],
        [
            depth("a/patient", 1, oldest=600),
            depth("a/strict", 1, oldest=600),
            depth("b/x", 1, oldest=600),
        ],
        {},
        default_stuck_after=300,
    )
    over = {r.destination: r.over_threshold for r in rows}
    assert over == {"a/patient": False, "a/strict": True, "b/x": True}
    assert {r.destination: r.stuck_after for r in rows} == {
        "a/patient": 3600,
        "a/strict": 60,
        "b/x": 300,
    }


def test_an_unreachable_receiver_is_failing_though_no_attempt_was_counted() -> None:
    rows = build(
        [listed("a/down")],
        [depth("a/down", 4, oldest=60, attempts=0)],
        {"a/down": HeadInfo(1, 0, 20.0, "unreachable: connect lab:2575: refused")},
        default_stuck_after=900,
    )
    [row] = rows
    assert (row.state, row.ready, row.last_error_class) == ("failing", 0, "unreachable")
