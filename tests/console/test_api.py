"""The console's JSON API and pages over real HTTP, against the real store."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg import AsyncConnection

from inturn.worker.console.server import ConsoleServer
from inturn.worker.store import actions, delivery
from inturn.worker.store import feeds as feeds_store
from inturn.worker.store import lease as leases
from inturn.worker.testing import MllpReceiver
from tests.support.console import Client, enqueue, place_work, register, worker
from tests.support.pipeline import until

DEST = "ward/lab"
ITEMS = f"/api/v1/destinations/{DEST}/items"


async def test_unauthenticated_gets_401_and_nothing_else(clients: dict[str | None, Client]) -> None:
    nobody = clients[None]
    for path in ("/", "/api/v1/overview", "/static/htmx.min.js", "/audit", "/events"):
        assert await nobody.get(path) == (401, {"error": {"code": "unauthenticated"}}), path
    status, body = await nobody.post("/api/v1/items/1/skip", {"why": "x"}, csrf=False)
    assert (status, body) == (401, {"error": {"code": "unauthenticated"}})
    wrong = Client(nobody.session, nobody.base, None)
    wrong.headers = {"Authorization": "Bearer not-a-known-token-at-all"}
    assert (await wrong.get("/api/v1/me"))[0] == 401
    async with nobody.session.get(nobody.base + "/healthz") as r:
        assert r.status == 200


async def test_every_answer_carries_a_strict_content_security_policy(
    clients: dict[str | None, Client],
) -> None:
    c = clients["viewer"]
    async with c.session.get(c.base + "/", headers=c.headers) as r:
        csp = r.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert r.headers["X-Frame-Options"] == "DENY"
        assert r.headers["Cache-Control"] == "no-store"


async def test_overview_counts_match_queue_depth(
    fresh_db: str, console: ConsoleServer, clients: dict[str | None, Client]
) -> None:
    await register(fresh_db, DEST, sender="mllp://lab:2575")
    await register(fresh_db, "ward/idle")
    ids = await enqueue(fresh_db, DEST, [1, 2, 3])
    await enqueue(fresh_db, "gone/orphan", [4])
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await delivery.retry(
            conn,
            ids[0],
            2,
            60,
            "connection: refused",
            lease=await leases.acquire(conn, DEST, "test", 600),
        )
        await delivery.gave_up(
            conn, ids[2], 1, "application: AR", lease=await leases.acquire(conn, DEST, "test", 600)
        )
    console.console.feed.poke()

    async def settled() -> bool:
        _, body = await clients["viewer"].get("/api/v1/overview")
        return any(r["mostAttempts"] == 2 for r in body["destinations"])

    await until(settled)
    _, body = await clients["viewer"].get("/api/v1/overview")
    rows = {r["destination"]: r for r in body["destinations"]}
    cli = subprocess.run(
        [
            str(Path(sys.executable).with_name("inturn")),
            "queue",
            "depth",
            "--json",
            "--dsn",
            fresh_db,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    depth = {d["destination"]: d for d in json.loads(cli.stdout)}
    for name, d in depth.items():
        assert (rows[name]["pending"], rows[name]["failed"], rows[name]["mostAttempts"]) == (
            d["pending"],
            d["failed"],
            d["mostAttempts"],
        )
    lab = rows[DEST]
    assert lab["state"] == "failing" and lab["ready"] == 0 and lab["headWaitSeconds"] > 50
    assert lab["lastErrorClass"] == "connection" and lab["sender"] == "mllp://lab:2575"
    assert rows["gone/orphan"]["state"] == "orphaned"
    assert rows["ward/idle"] == rows["ward/idle"] | {"state": "idle", "pending": 0, "ready": 0}
    # worst first: the failing destination with a failed item before the idle one
    assert [r["destination"] for r in body["destinations"]][-1] == "ward/idle"


async def test_items_newest_first_cursor_paged_capped_and_without_payloads(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    ids = await enqueue(fresh_db, DEST, list(range(1, 1106)))
    viewer = clients["viewer"]
    status, first = await viewer.get(ITEMS + "?limit=100")
    assert status == 200 and first["total"] == 1105
    assert [i["id"] for i in first["items"]] == ids[::-1][:100]
    _, second = await viewer.get(ITEMS + f"?limit=100&cursor={first['nextCursor']}")
    assert [i["id"] for i in second["items"]] == ids[::-1][100:200]
    _, big = await viewer.get(ITEMS + "?limit=5000")
    assert len(big["items"]) == 1000
    _, last = await viewer.get(ITEMS + f"?limit=1000&cursor={big['nextCursor']}")
    assert len(last["items"]) == 105 and last["nextCursor"] is None
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await actions.skip(conn, ids[5], who="t")
    _, skipped = await viewer.get(ITEMS + "?state=skipped")
    assert [i["id"] for i in skipped["items"]] == [ids[5]]
    assert (await viewer.get(ITEMS + "?state=nonsense"))[1]["error"]["code"] == "invalid_request"
    for text in (json.dumps(first), await viewer.get(f"/destinations/{DEST}?limit=1000")):
        assert "DOE^JOHN" not in str(text) and "PID|" not in str(text)


async def test_state_changes_need_the_csrf_token_and_this_origin(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    [item] = await enqueue(fresh_db, DEST, [1])
    op = clients["operator"]
    status, body = await op.post(f"/api/v1/items/{item}/skip", {"why": "test"}, csrf=False)
    assert (status, body["error"]["code"]) == (403, "csrf_failed")
    headers = op.headers | {"X-CSRF-Token": await op.csrf(), "Origin": "http://evil.example"}
    async with op.session.post(
        op.base + f"/api/v1/items/{item}/skip", json={"why": "x"}, headers=headers
    ) as r:
        assert r.status == 403
    other = clients["viewer"]
    headers = op.headers | {"X-CSRF-Token": await other.csrf()}  # someone else's token
    async with op.session.post(
        op.base + f"/api/v1/items/{item}/skip", json={"why": "x"}, headers=headers
    ) as r:
        assert r.status == 403
    _, detail = await op.get(f"/api/v1/items/{item}")
    assert detail["item"]["state"] == "pending"


async def test_roles_and_who_is_the_authenticated_identity(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    a, b = await enqueue(fresh_db, DEST, [1, 2])
    status, body = await clients["viewer"].post(f"/api/v1/items/{a}/skip", {"why": "no"})
    assert (status, body["error"]["code"]) == (403, "forbidden")
    status, body = await clients["operator"].post(f"/api/v1/items/{a}/skip", {})
    assert (status, body["error"]["code"]) == (400, "reason_required")
    status, body = await clients["operator"].post(
        f"/api/v1/items/{a}/skip", {"why": "receiver rejects it for ever", "who": "mallory"}
    )
    assert (status, body["error"]["code"]) == (400, "invalid_request")  # who is never a field
    status, body = await clients["operator"].post(
        f"/api/v1/items/{a}/skip", {"why": "receiver rejects it for ever"}
    )
    assert (status, body) == (200, {"action": "skip", "itemId": a, "changed": [a]})
    status, body = await clients["operator"].post(f"/api/v1/items/{a}/skip", {"why": "again"})
    assert (status, body["error"]["code"]) == (409, "conflict")
    status, body = await clients["operator"].post(f"/api/v1/items/{b}/remove", {})
    assert (status, body["error"]["code"]) == (409, "conflict")
    status, body = await clients["operator"].post(f"/api/v1/items/{a}/erase", {"why": "x"})
    assert (status, body["error"]["code"]) == (403, "forbidden")
    # a skipped item is copied only when asked for, as the command line's --include-delivered
    status, body = await clients["operator"].post(f"/api/v1/items/{a}/resend", {})
    assert (status, body["error"]["code"]) == (409, "conflict")
    assert "only failed items are resent" in body["error"]["message"]
    status, body = await clients["operator"].post(
        f"/api/v1/items/{a}/resend", {"includeDelivered": True}
    )
    assert status == 200 and body["changed"][0] == a
    _, audit = await clients["viewer"].get(f"/api/v1/audit?itemId={a}")
    assert [(e["who"], e["action"]) for e in audit["entries"]] == [
        ("otto", "resend"),
        ("otto", "skip"),
    ]
    assert audit["entries"][1]["why"] == "receiver rejects it for ever"
    status, body = await clients["privacy"].post(f"/api/v1/items/{a}/erase", {"why": "request"})
    assert status == 200 and body["changed"] == [a]
    assert (await clients["viewer"].get(f"/api/v1/items/{a}"))[0] == 404


async def test_drain_needs_the_typed_name_and_a_reason(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    await enqueue(fresh_db, DEST, [1, 2, 3])
    op = clients["operator"]
    path = f"/api/v1/destinations/{DEST}/drain"
    assert (await op.post(path, {"why": "stale", "confirm": "ward/la"}))[1]["error"][
        "code"
    ] == "confirmation_mismatch"
    assert (await op.post(path, {"confirm": DEST}))[1]["error"]["code"] == "reason_required"
    status, body = await op.post(path, {"why": "a week stale", "confirm": DEST})
    assert (status, body) == (200, {"action": "drain", "destination": DEST, "changed": 3})
    _, page = await op.get(ITEMS + "?state=pending")
    assert page["total"] == 0


async def test_payload_only_for_privacy_with_a_reason_and_audited(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    [item] = await enqueue(fresh_db, DEST, [7])
    path = f"/api/v1/items/{item}/payload"
    for role in ("viewer", "operator"):
        status, body = await clients[role].post(path, {"why": "curious"})
        assert status == 403 and "DOE" not in json.dumps(body)
    assert (await clients["privacy"].post(path, {}))[0] == 400
    status, body = await clients["privacy"].post(path, {"why": "ticket 4711"})
    assert status == 200
    assert body["segments"][0].startswith("MSH|^~\\&|ADT|")
    assert body["segments"][1] == "PID|1||P7^^^HOSP^MR||DOE^JOHN"
    _, audit = await clients["viewer"].get(f"/api/v1/audit?itemId={item}")
    assert [(e["who"], e["action"], e["why"]) for e in audit["entries"]] == [
        ("pia", "view-payload", "ticket 4711")
    ]
    assert "DOE" not in json.dumps(audit)


async def test_a_payload_is_shown_as_stored_and_as_its_receiver_gets_it(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    """Issue 42: the viewing shows the destination's receiver profile applied to the stored
    bytes beside them (MSH-13: the number it would get, not sent yet), or its refusal."""
    await register(fresh_db, DEST)
    [item] = await enqueue(fresh_db, DEST, [7])
    path = f"/api/v1/items/{item}/payload"
    _, body = await clients["privacy"].post(path, {"why": "ticket 1"})
    assert body["asSent"]["shaped"] is False  # no profile: the receiver gets these bytes
    assert body["asSent"]["segments"] == body["segments"]
    profile = {"set": {"MSH-5": "NORTH"}, "removeSegments": ["PV1"], "sequenceNumbers": True}
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute(
            "UPDATE inturn_destination SET profile = %s::jsonb WHERE destination = %s",
            (json.dumps(profile), DEST),
        )
    _, body = await clients["privacy"].post(path, {"why": "ticket 2"})
    sent = body["asSent"]
    assert (sent["shaped"], sent["sequence"], sent["reserved"]) == (True, 1, False)
    assert sent["segments"][0].split("|")[4] == "NORTH"
    assert sent["segments"][0].split("|")[12] == "1"
    assert body["segments"][0].split("|")[4] != "NORTH"  # the stored bytes as stored
    maps = [{"field": "PID-5.1", "table": {}, "otherwise": "hold"}]
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute(
            "UPDATE inturn_destination SET profile = %s::jsonb WHERE destination = %s",
            (json.dumps({"maps": maps}), DEST),
        )
    _, body = await clients["privacy"].post(path, {"why": "ticket 3"})
    assert body["asSent"]["segments"] is None
    assert body["asSent"]["refusal"] == ("PID-5.1 'DOE': has no entry in the map (otherwise: hold)")


async def test_last_error_control_characters_are_escaped(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    [item] = await enqueue(fresh_db, DEST, [1])
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await delivery.retry(
            conn,
            item,
            1,
            60,
            "application: AE \x1b[31mred\x07<b>",
            lease=await leases.acquire(conn, DEST, "test", 600),
        )
    status, html = await clients["viewer"].get(f"/items/{item}")
    assert status == 200
    assert "AE \\x1b[31mred\\x07&lt;b&gt;" in html
    assert "\x1b" not in html and "\x07" not in html
    _, detail = await clients["viewer"].get(f"/api/v1/items/{item}")
    assert [(a["attempt"], a["outcome"]) for a in detail["attempts"]] == [(1, "retry")]


async def test_suspend_holds_the_worker_and_resume_wakes_it(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    await register(fresh_db, DEST)
    op = clients["operator"]
    async with MllpReceiver() as rx, worker(fresh_db, DEST, rx.port):
        status, body = await op.post(f"/api/v1/destinations/{DEST}/suspend", {"why": "upgrade"})
        assert (status, body["changed"]) == (200, 1)
        await enqueue(fresh_db, DEST, [1, 2])
        await asyncio.sleep(2.5)  # more than two idle periods of the worker: still nothing
        assert rx.received == []
        _, overview = await op.get("/api/v1/overview")
        [row] = [r for r in overview["destinations"] if r["destination"] == DEST]
        assert (row["state"], row["heldBy"], row["ready"]) == ("held", "otto", 0)
        await op.post(f"/api/v1/destinations/{DEST}/resume", {})

        async def delivered() -> bool:
            return len(rx.received) == 2

        await until(delivered)
    _, audit = await op.get(f"/api/v1/audit?destination={DEST}")
    assert [e["action"] for e in audit["entries"]] == ["resume", "suspend"]
    status, body = await op.post("/api/v1/destinations/nowhere/none/suspend", {})
    assert (status, body["error"]["code"]) == (404, "not_found")
    # nor a page of buttons for it (a new user's trial got one, with 200)
    status, page = await op.get("/destinations/nowhere/none")
    assert status == 404
    assert "no destination nowhere/none: not registered, no message" in page
    assert "Suspend" not in page


async def test_worklists_counts_filter_and_clear_with_a_note(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    a, b, c = await place_work(
        fresh_db,
        [
            ("delivery-failed", "delivery", "17", "failed"),
            ("delivery-failed", "delivery", "18", "failed"),
            ("destinations", "destination", DEST, "destination-stuck"),
        ],
    )
    viewer, op = clients["viewer"], clients["operator"]
    _, counts = await viewer.get("/api/v1/worklists/counts")
    assert [(r["queue"], r["reason"], r["items"]) for r in counts["counts"]] == [
        ("delivery-failed", "failed", 2),
        ("destinations", "destination-stuck", 1),
    ]
    _, page = await viewer.get("/api/v1/worklists/items?queue=delivery-failed&limit=1")
    assert [i["id"] for i in page["items"]] == [a] and page["nextCursor"] == a
    _, page = await viewer.get(f"/api/v1/worklists/items?queue=delivery-failed&cursor={a}")
    assert [i["id"] for i in page["items"]] == [b]
    path = f"/api/v1/worklists/items/{c}/clear"
    assert (await viewer.post(path, {"note": "looked"}))[0] == 403
    assert (await op.post(path, {}))[1]["error"]["code"] == "reason_required"
    status, item = await op.post(path, {"note": "receiver back, backlog drained"})
    assert status == 200 and (item["state"], item["clearedBy"]) == ("cleared", "otto")
    status, body = await op.post(path, {"note": "again"})
    assert status == 409 and "already cleared by otto" in body["error"]["message"]
    _, audit = await viewer.get(f"/api/v1/audit?itemId={c}")
    assert [(e["who"], e["why"]) for e in audit["entries"]] == [
        ("otto", "receiver back, backlog drained")
    ]
    _, counts = await viewer.get("/api/v1/worklists/counts?state=cleared")
    assert [r["items"] for r in counts["counts"]] == [1]


async def test_a_nul_character_is_refused_not_a_server_error(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    [item] = await enqueue(fresh_db, DEST, [1])
    op = clients["operator"]
    status, body = await op.get("/api/v1/worklists/items?reason=a%00b")
    assert (status, body["error"]["code"]) == (400, "invalid_request")
    assert (await op.get("/audit?destination=a%00b"))[0] == 400
    status, body = await op.post(f"/api/v1/items/{item}/skip", {"why": "a\x00b"})
    assert (status, body["error"]["code"]) == (400, "invalid_request")


async def test_the_overview_shows_feeds_as_a_second_table(
    fresh_db: str, console: ConsoleServer, clients: dict[str | None, Client]
) -> None:
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await feeds_store.declare(
            conn,
            [
                feeds_store.DeclaredFeed("adt", 600, False, None),
                feeds_store.DeclaredFeed("lab", 600, True, None),
            ],
        )
        await conn.execute(
            "UPDATE inturn_feed SET last_message_at = now() - interval '1 hour'"
            " WHERE channel = 'adt'"
        )
        await conn.execute("UPDATE inturn_feed SET last_message_at = now() WHERE channel = 'lab'")
    console.console.feed.poke()

    async def settled() -> bool:
        _, body = await clients["viewer"].get("/api/v1/overview")
        return len(body["feeds"]) == 2

    await until(settled)
    _, body = await clients["viewer"].get("/api/v1/overview")
    adt, lab = body["feeds"]  # worst first
    assert (adt["channel"], adt["state"], adt["overThreshold"]) == ("adt", "silent", True)
    assert 3500 < adt["quietSeconds"] < 4000 and adt["silentAfterSeconds"] == 600
    assert (lab["channel"], lab["state"], lab["sender"]) == ("lab", "receiving", None)
    status, page = await clients["viewer"].get("/")
    assert status == 200
    assert 'data-feed="adt" data-state="silent"' in page


async def test_resend_failed_copies_in_order_and_the_failed_count_drops(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    await register(fresh_db, DEST)
    ids = await enqueue(fresh_db, DEST, [1, 2, 3])
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute(
            "UPDATE inturn_delivery SET state = 'failed', finished_at = now() WHERE id = ANY(%s)",
            (ids,),
        )
    path = f"/api/v1/destinations/{DEST}/resend-failed"
    assert (await clients["viewer"].post(path, {}))[0] == 403
    status, body = await clients["operator"].post(path, {"why": "fixed"})
    assert (status, body) == (200, {"action": "resend-failed", "destination": DEST, "changed": 3})
    _, page = await clients["operator"].get(ITEMS + "?state=failed")
    assert [(i["id"], i["resentAs"] is not None) for i in page["items"]] == [
        (i, True) for i in reversed(ids)
    ]
    copies = sorted(i["resentAs"] for i in page["items"])
    _, pending = await clients["operator"].get(ITEMS + "?state=pending")
    assert [i["resentFrom"] for i in reversed(pending["items"])] == ids
    assert [i["id"] for i in reversed(pending["items"])] == copies
    # nothing is left to resend: a conflict that says so
    status, body = await clients["operator"].post(path, {})
    assert status == 409 and "no failed item left to resend" in body["error"]["message"]


async def test_a_live_view_closed_by_its_browser_is_logged_at_info_without_a_traceback(
    console: ConsoleServer, fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 28, item 7: a browser closing the overview's event stream is ordinary; the
    console logs it at INFO at most, never ERROR with a traceback."""
    import logging
    import socket

    from tests.support.console import TOKENS

    caplog.set_level(logging.DEBUG)
    await register(fresh_db, DEST)
    reader, writer = await asyncio.open_connection("127.0.0.1", console.port)
    writer.write(
        f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{console.port}\r\n"
        f"Authorization: Bearer {TOKENS['viewer'][1]}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    async with asyncio.timeout(10):
        seen = b""
        while b"event: overview" not in seen:
            seen += await reader.read(65536)
    # the browser goes away abruptly (RST, as a closed tab often does)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.transport.abort()
    for n in range(3):  # new snapshots: the stream would have more to send
        await enqueue(fresh_db, DEST, [n])
        await asyncio.sleep(0.8)
    loud = [r for r in caplog.records if r.levelno > logging.INFO]
    assert [(r.name, r.getMessage()) for r in loud] == []
    assert not any(r.exc_info for r in caplog.records)


async def test_a_hostile_json_body_is_refused_in_one_line(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    """A member given twice (a second ``why`` no longer silently wins), a body nested past the
    depth bound (10,000 levels no longer end in a RecursionError and a 500), a body that is not
    an object: 400 invalid_request, and nothing done."""
    [item] = await enqueue(fresh_db, DEST, [1])
    op = clients["operator"]
    headers = {**op.headers, "X-CSRF-Token": await op.csrf(), "Content-Type": "application/json"}
    for raw, says in (
        (b'{"why": "ok", "why": "other"}', "given twice"),
        (b"[" * 10_000 + b"]" * 10_000, "nested deeper than"),
        (b'{"why": ' + b"[" * 100 + b"]" * 100 + b"}", "nested deeper than"),
        (b'["why"]', "must be a JSON object"),
    ):
        async with op.session.post(
            op.base + f"/api/v1/items/{item}/skip", data=raw, headers=headers
        ) as r:
            body = await r.json()
        assert (r.status, body["error"]["code"]) == (400, "invalid_request"), body
        assert says in body["error"]["message"] and "\n" not in body["error"]["message"]
    _, detail = await op.get(f"/api/v1/items/{item}")
    assert detail["item"]["state"] == "pending"
