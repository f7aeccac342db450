"""Finding a message in the console, through real HTTP: by control ID for any role, by patient
identifier for the privacy role only (audited, through the identifier index), and each message's
page with its whole life (attempts, resends, the same control ID elsewhere, worklist items,
audit entries)."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from psycopg import AsyncConnection

from inturn.worker.store import queue
from inturn.worker.store.model import NewItem
from tests.support.console import Client, message, place_work, register
from tests.support.pipeline import cli

pytestmark = pytest.mark.store

LAB, RIS = "ward/lab", "ward/ris"


async def seed(dsn: str) -> dict[str, int]:
    """MSG00001 (patient P1) for both destinations, MSG00002 (patient P2) for the lab, and
    MSG00003 (P1 again, assigned by OTHER) for the lab; their ids by a short name."""
    await register(dsn, LAB)
    await register(dsn, RIS)
    other = message(3).replace(b"P3^^^HOSP^MR", b"P1^^^OTHER^MR")
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        ids = await queue.enqueue(
            conn,
            [
                NewItem(LAB, "adt", "MSG00001", "ADT^A01", message(1)),
                NewItem(RIS, "adt", "MSG00001", "ADT^A01", message(1)),
                NewItem(LAB, "adt", "MSG00002", "ADT^A01", message(2)),
                NewItem(LAB, "adt", "MSG00003", "ADT^A01", other),
            ],
        )
    return dict(zip(("lab1", "ris1", "lab2", "lab3"), ids, strict=True))


async def audit_entries(client: Client) -> list[dict[str, Any]]:
    status, body = await client.get("/api/v1/audit")
    assert status == 200
    return list(body["entries"])


async def test_by_control_id_for_every_role(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    ids = await seed(fresh_db)
    for role in ("viewer", "operator", "privacy"):
        status, body = await clients[role].get("/api/v1/search?controlId=MSG00001")
        assert status == 200
        assert body["total"] == 2
        assert [(i["id"], i["destination"]) for i in body["items"]] == [
            (ids["ris1"], RIS),
            (ids["lab1"], LAB),
        ]
    status, body = await clients["viewer"].get("/api/v1/search?controlId=NOPE")
    assert (status, body) == (200, {"total": 0, "items": []})
    status, body = await clients["viewer"].get("/api/v1/search?controlId=%20")
    assert status == 400 and body["error"]["code"] == "invalid_request"
    assert (await clients["viewer"].get("/api/v1/search"))[0] == 400
    assert (await clients["viewer"].get("/api/v1/search?controlId=X&other=1"))[0] == 400
    assert (await clients[None].get("/api/v1/search?controlId=MSG00001"))[0] == 401
    # a search by control ID reads no payload and is not audited
    assert await audit_entries(clients["viewer"]) == []


async def test_the_search_box_is_on_every_page_and_leads_to_the_items(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    ids = await seed(fresh_db)
    for path in ("/", f"/destinations/{LAB}", f"/items/{ids['lab1']}", "/audit", "/worklists"):
        status, page = await clients["viewer"].get(path)
        assert status == 200, path
        assert '<form method="get" action="/search" class="search" id="find"' in page, path
        assert 'id="find-patient-form"' not in page, path  # viewers cannot search patients
        status, page = await clients["privacy"].get(path)
        assert 'id="find-patient-form"' in page, path
    status, page = await clients["viewer"].get("/search?controlId=MSG00001")
    assert status == 200
    listed = re.findall(r'<tr data-item="(\d+)"', page)
    assert listed == [str(ids["ris1"]), str(ids["lab1"])]
    assert "2 of 2 item(s)" in page
    status, page = await clients["viewer"].get("/search")
    assert status == 200 and 'id="search-results"' not in page


async def test_by_patient_only_for_privacy_with_a_reason_and_audited(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    ids = await seed(fresh_db)
    path = "/api/v1/search/patient"
    for role in ("viewer", "operator"):
        status, body = await clients[role].post(path, {"patientId": "P1", "why": "ticket 9"})
        assert status == 403 and body["error"]["code"] == "forbidden"
    status, body = await clients["privacy"].post(path, {"patientId": "P1"})
    assert status == 400 and body["error"]["code"] == "reason_required"
    status, body = await clients["privacy"].post(path, {"patientId": " ", "why": "ticket 9"})
    assert status == 400 and body["error"]["code"] == "invalid_request"
    assert (await clients["privacy"].post(path, {"patientId": "P1", "why": "x"}, csrf=False))[
        0
    ] == 403
    assert await audit_entries(clients["viewer"]) == []  # nothing refused was audited

    status, body = await clients["privacy"].post(path, {"patientId": "P1", "why": "ticket 9"})
    assert status == 200
    assert body == {
        "total": 3,
        "items": body["items"],
        "unindexed": 0,
    }
    assert [i["id"] for i in body["items"]] == [ids["lab3"], ids["ris1"], ids["lab1"]]
    status, body = await clients["privacy"].post(
        path, {"patientId": "P1", "authority": "OTHER", "why": "ticket 9"}
    )
    assert [i["id"] for i in body["items"]] == [ids["lab3"]]
    status, body = await clients["privacy"].post(path, {"patientId": "P9", "why": "ticket 10"})
    assert body["total"] == 0

    entries = await audit_entries(clients["viewer"])
    assert [(e["who"], e["action"], e["itemIds"], e["why"]) for e in entries] == [
        ("pia", "search-patient", [], "ticket 10"),
        ("pia", "search-patient", [ids["lab3"]], "ticket 9"),
        ("pia", "search-patient", [ids["lab3"], ids["ris1"], ids["lab1"]], "ticket 9"),
    ]
    assert "P1" not in json.dumps(entries) and "OTHER" not in json.dumps(entries)
    # and each item found shows the search on its own page
    status, detail = await clients["viewer"].get(f"/api/v1/items/{ids['ris1']}")
    assert [e["action"] for e in detail["audit"]] == ["search-patient"]


async def test_every_front_ends_lookup_by_patient_is_one_audited_rule(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    """The same lookup of P1 from the console's API, its search form, ``inturn queue list
    --patient-id`` and ``inturn queue erase --patient-id --dry-run`` (real processes) leaves one
    ``search-patient`` entry each, with the reason and the ids shown and never the identifier;
    an erasure by patient that matched nothing is recorded too; each refusal (no reason, no
    privacy role) reads nothing and records nothing."""
    ids = await seed(fresh_db)
    found = [ids["lab3"], ids["ris1"], ids["lab1"]]  # newest first

    async def run(*args: str) -> tuple[int, str, str]:
        done = await asyncio.to_thread(cli, fresh_db, *args, check=False)
        return done.returncode, done.stdout.decode(), done.stderr.decode()

    # the refusals first: the CLI without a reason, the console without the role
    code, out, err = await run("queue", "list", "--patient-id", "P1")
    assert (code, out) == (2, "") and "search-patient needs a reason (--why)" in err
    code, out, err = await run("queue", "erase", "--patient-id", "P1", "--who", "d", "--dry-run")
    assert (code, out) == (2, "") and "needs a reason (--why)" in err
    code, out, err = await run("queue", "list", "--why", "x")
    assert code == 2 and "--why goes with --patient-id" in err
    path = "/api/v1/search/patient"
    status, _ = await clients["operator"].post(path, {"patientId": "P1", "why": "ticket 9"})
    assert status == 403
    assert await audit_entries(clients["viewer"]) == []

    status, body = await clients["privacy"].post(path, {"patientId": "P1", "why": "ticket 9"})
    assert status == 200 and [i["id"] for i in body["items"]] == found
    asked = {"patientId": "P1", "why": "ticket 9"}
    status, _, page = await clients["privacy"].form("/search", asked)
    assert status == 200
    assert re.findall(r'<tr data-item="(\d+)"', page) == [str(i) for i in found]
    code, out, err = await run(
        "queue", "list", "--patient-id", "P1", "--who", "dpo", "--why", "ticket 9", "--json"
    )
    assert (code, err) == (0, "") and [i["id"] for i in json.loads(out)["items"]] == found
    # the listing's other filters narrow what is shown, and so what is audited
    code, out, err = await run(
        "queue", "list", "--patient-id", "P1", "-d", LAB, "--who", "dpo", "--why", "ticket 9",
        "--json",
    )  # fmt: skip
    assert code == 0 and [i["id"] for i in json.loads(out)["items"]] == [ids["lab3"], ids["lab1"]]
    code, out, err = await run(
        "queue", "erase", "--patient-id", "P1", "--who", "dpo", "--why", "ticket 9", "--dry-run",
        "--json",
    )  # fmt: skip
    assert code == 0 and sorted(m["id"] for m in json.loads(out)["matched"]) == sorted(found)
    code, out, err = await run(
        "queue", "erase", "--patient-id", "P9", "--who", "dpo", "--why", "ticket 10", "--json"
    )
    assert code == 0 and json.loads(out)["erased"] == []
    code, out, err = await run("queue", "list", "--control-id", "MSG00001", "--json")
    assert code == 0 and json.loads(out)["total"] == 2  # no patient named: not audited

    entries = await audit_entries(clients["viewer"])
    assert [(e["who"], e["action"], e["itemIds"], e["why"]) for e in entries] == [
        ("dpo", "erase", [], "ticket 10"),
        ("dpo", "search-patient", sorted(found), "ticket 9"),
        ("dpo", "search-patient", [ids["lab3"], ids["lab1"]], "ticket 9"),
        ("dpo", "search-patient", found, "ticket 9"),
        ("pia", "search-patient", found, "ticket 9"),
        ("pia", "search-patient", found, "ticket 9"),
    ]
    assert "P1" not in json.dumps(entries) and "P9" not in json.dumps(entries)
    async with await AsyncConnection.connect(fresh_db) as conn:
        left = await (await conn.execute("SELECT count(*) FROM inturn_delivery")).fetchone()
    assert left == (4,)


async def test_the_patient_form_posts_the_identifier_never_in_a_url(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    ids = await seed(fresh_db)
    form = {"patientId": "P2", "why": "ticket 11"}
    status, url, page = await clients["privacy"].form("/search", form)
    assert status == 200
    assert "P2" not in url
    assert re.findall(r'<tr data-item="(\d+)"', page) == [str(ids["lab2"])]
    assert "This search is in the audit" in page
    assert "P2" not in page.split('id="search-results"')[0].split("</header>")[1]
    status, _, _ = await clients["viewer"].form("/search", form)
    assert status == 403


async def test_an_items_page_tells_its_whole_life(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    ids = await seed(fresh_db)
    lab1 = ids["lab1"]
    operator = clients["operator"]
    assert (await operator.post(f"/api/v1/items/{lab1}/skip", {"why": "lab down"}))[0] == 200
    status, resent = await operator.post(
        f"/api/v1/items/{lab1}/resend", {"why": "lab back", "includeDelivered": True}
    )
    assert status == 200
    copy = resent["changed"][1]
    [work] = await place_work(fresh_db, [("delivery-failed", "delivery", str(lab1), "gave-up")])

    for item in (lab1, copy):
        status, detail = await clients["viewer"].get(f"/api/v1/items/{item}")
        assert status == 200
        assert [(r["id"], r["state"]) for r in detail["resends"]] == [
            (lab1, "skipped"),
            (copy, "pending"),
        ]
        # the same message for the other destination (and, for the copy, its original)
        same = [i["id"] for i in detail["sameControlId"]]
        assert same == [i for i in (copy, ids["ris1"], lab1) if i != item]
    status, detail = await clients["viewer"].get(f"/api/v1/items/{lab1}")
    assert [(w["id"], w["queue"], w["reason"], w["state"]) for w in detail["worklist"]] == [
        (work, "delivery-failed", "gave-up", "pending")
    ]
    assert [(e["action"], e["why"]) for e in detail["audit"]] == [
        ("resend", "lab back"),
        ("skip", "lab down"),
    ]
    status, detail = await clients["viewer"].get(f"/api/v1/items/{ids['lab2']}")
    assert (detail["resends"], detail["sameControlId"], detail["worklist"]) == ([], [], [])

    status, page = await clients["viewer"].get(f"/items/{lab1}")
    assert status == 200
    resends = page.split('id="resends"')[1].split("</ol>")[0]
    assert re.findall(r'data-item="(\d+)"', resends) == [str(lab1), str(copy)]
    assert "(this one)" in resends
    same = page.split('id="same-control-id"')[1].split("</table>")[0]
    assert re.findall(r'<tr data-item="(\d+)"', same) == [str(copy), str(ids["ris1"])]
    worklist = page.split('id="item-worklist"')[1].split("</table>")[0]
    assert f'data-work="{work}"' in worklist and "gave-up" in worklist


async def test_a_finished_items_page_marks_the_resend_that_sends_it_again(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    """The resend rule on the item page: a failed item's button copies it; a delivered or
    skipped item's is a separate, marked button that says so (include_delivered), as the
    command line's --include-delivered."""
    ids = await seed(fresh_db)
    operator = clients["operator"]
    assert (await operator.post(f"/api/v1/items/{ids['lab1']}/skip", {"why": "dup"}))[0] == 200
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute(
            "UPDATE inturn_delivery SET state = 'failed', finished_at = now() WHERE id = %s",
            (ids["lab2"],),
        )
    status, skipped = await operator.get(f"/items/{ids['lab1']}")
    assert status == 200
    form = skipped.split('action="/items/{}/resend"'.format(ids["lab1"]))[1].split("</form>")[0]
    assert '<input type="hidden" name="include_delivered" value="1">' in form
    assert "Resend a copy (it was skipped on purpose)" in form
    status, failed = await operator.get(f"/items/{ids['lab2']}")
    form = failed.split('action="/items/{}/resend"'.format(ids["lab2"]))[1].split("</form>")[0]
    assert "include_delivered" not in form and ">Resend a copy</button>" in form


async def test_the_patient_search_finds_a_message_by_identifiers_past_the_index_cap(
    fresh_db: str, clients: dict[str | None, Client]
) -> None:
    """A message naming 150 identifiers is indexed under its first 100 and marked as cut: the
    console's search still finds it by the 101st and the 150th (its payload is read)."""
    await register(fresh_db, LAB)
    reps = "~".join(f"MANY{n}^^^HOSP" for n in range(1, 151))
    many = message(1).replace(b"P1^^^HOSP^MR", reps.encode())
    async with await AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        big, other = await queue.enqueue(
            conn,
            [
                NewItem(LAB, "adt", "MSG00001", "ADT^A01", many),
                NewItem(LAB, "adt", "MSG00002", "ADT^A01", message(2)),
            ],
        )
    path = "/api/v1/search/patient"
    for n in (1, 100, 101, 150):
        status, body = await clients["privacy"].post(path, {"patientId": f"MANY{n}", "why": "t"})
        assert (status, body["total"], [i["id"] for i in body["items"]]) == (200, 1, [big])
    status, body = await clients["privacy"].post(path, {"patientId": "MANY151", "why": "t"})
    assert (body["total"], body["items"]) == (0, [])
    status, body = await clients["privacy"].post(path, {"patientId": "P2", "why": "t"})
    assert [i["id"] for i in body["items"]] == [other]
    shown = [e["itemIds"] for e in await audit_entries(clients["viewer"])]
    assert shown.count([big]) == 4
