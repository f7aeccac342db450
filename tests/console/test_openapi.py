"""The OpenAPI document is kept true: schemathesis generates requests from it and runs them
against a live ``inturn console`` process (the real command, on a free port), checking every
answer's status, content type and body against the document."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from inturn.worker.console.api import openapi_document
from inturn.worker.store import queue
from inturn.worker.store.model import NewItem

INTURN = str(Path(sys.executable).with_name("inturn"))
TOKEN = "schemathesis-token-0123456789"

schema = schemathesis.openapi.from_dict(openapi_document())
#: The CSRF token of the live console's identity (set once the console runs).
CSRF: dict[str, str] = {}


@schema.auth()
class BearerAndCsrf:
    """The credentials, applied by schemathesis itself, so that it knows them (a case it made
    without them on purpose is not mistaken for one the server wrongly accepted)."""

    def get(self, case: schemathesis.Case, context: object) -> str:
        return TOKEN

    def set(self, case: schemathesis.Case, data: str, context: object) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}
        case.headers["X-CSRF-Token"] = CSRF.get("token", "")


@pytest.fixture(scope="module")
def live(
    dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    """``inturn console`` as a subprocess with a token holding every role; some items queued.

    Yields the base URL and the headers of an authenticated call (bearer token, CSRF token).
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO inturn_destination (destination, namespace, name, channel)"
            " VALUES ('ward/lab', 'ward', 'lab', 'adt') ON CONFLICT DO NOTHING"
        )
    import asyncio

    async def seed() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await queue.enqueue(
                conn,
                [
                    NewItem("ward/lab", "adt", f"C{n}", "ADT^A01", b"MSH|^~\\&|A|B\rPID|1\r")
                    for n in range(20)
                ],
            )

    asyncio.run(seed())
    auth = tmp_path_factory.mktemp("console") / "auth.yaml"
    auth.write_text(
        f"tokens:\n  - name: fuzz\n    roles: [viewer, operator, privacy]\n    token: {TOKEN}\n"
    )
    auth.chmod(0o600)  # a key file: others may not read it
    proc = subprocess.Popen(
        [INTURN, "console", "--dsn", dsn, "--listen", "127.0.0.1:0", "--auth-file", str(auth)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        port = None
        for line in proc.stderr:
            found = re.search(r"console serving on http://127\.0\.0\.1:(\d+)/", line)
            if found:
                port = int(found.group(1))
                break
        assert port, "the console did not start"
        base = f"http://127.0.0.1:{port}"
        import urllib.request

        request = urllib.request.Request(
            base + "/api/v1/me", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            import json

            csrf = json.load(r)["csrfToken"]
        CSRF["token"] = csrf
        yield base, {"Authorization": f"Bearer {TOKEN}", "X-CSRF-Token": csrf}
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_the_api_keeps_its_openapi_document(
    case: schemathesis.Case, live: tuple[str, dict[str, str]]
) -> None:
    base, _ = live
    # Every check but "schema-valid data is accepted": a valid body can still be refused by a
    # rule the document states in words (a reason, the typed name, the item's state), with a
    # documented 4xx and a stable code, which the other checks hold to the document.
    case.call_and_validate(
        base_url=base,
        excluded_checks=[schemathesis.checks.positive_data_acceptance],
    )
