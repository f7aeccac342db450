"""A sender configuration that validates never fails on its shape at send time (issue 27, item 5).

Generated configurations (header names and values of any characters, URL paths and queries of
any characters, hosts of any characters) are validated as a manifest would be; each one that
passes is then used for real: the HTTP sender posts to a real receiver, the resolver is asked
for the host. The only failures allowed are the sender's own (``DeliveryError``) or the
resolver's (``OSError``): never aiohttp's ``ValueError`` nor the IDNA codec's ``UnicodeError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import socket
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inturn.worker.senders.base import DeliveryError
from inturn.worker.senders.http import HttpSender, HttpSenderConfig
from inturn.worker.senders.shape import host_problem
from inturn.worker.spec.destination import ManifestError, validate_manifest
from inturn.worker.testing import HttpReceiver

MSG = b"MSH|^~\\&|A|B|C|D|20260101||ADT^A01|S1|P|2.5.1\rPID|1||42\r"
BASE: dict[str, Any] = {
    "apiVersion": "inturn.dev/v1alpha1",
    "kind": "Destination",
    "metadata": {"name": "lis", "namespace": "ward"},
    "spec": {"channel": "adt", "retry": {"maxAttempts": 3}},
}
#: Characters that make trouble: controls, separators, non-ASCII, the URL's own delimiters.
TRICKY = st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from(
    list("\r\n\t\x00\x0b\x7f :;,/?#[]@%\u2028\u0085é")
)


def validates(sender: dict[str, Any]) -> bool:
    doc = copy.deepcopy(BASE)
    doc["spec"]["sender"] = sender
    try:
        validate_manifest(doc)
    except ManifestError:
        return False
    return True


async def post(url: str, headers: dict[str, str]) -> None:
    sender = HttpSender(HttpSenderConfig(url, headers=headers), timeout_seconds=5)
    try:
        await sender.send(MSG)
    except DeliveryError:
        pass  # the receiver's answer or its absence: a failure of the send, not of the shape
    finally:
        await sender.close()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    headers=st.dictionaries(
        st.text(TRICKY, min_size=0, max_size=12), st.text(TRICKY, max_size=20), max_size=3
    ),
    tail=st.text(TRICKY, max_size=24),
)
def test_a_valid_http_sender_sends_whatever_its_headers_and_path(
    headers: dict[str, str], tail: str
) -> None:
    async def run() -> None:
        async with HttpReceiver() as receiver:
            url = f"{receiver.url}{tail}"
            if validates({"http": {"url": url, "headers": headers}}):
                await post(url, headers)

    asyncio.run(run())


@settings(max_examples=300, deadline=None)
@given(host=st.text(TRICKY, min_size=1, max_size=70))
def test_a_valid_host_never_crashes_the_resolver(host: str) -> None:
    if host_problem(host) is not None:
        return
    # numeric only: the name is encoded as a real lookup would, and nothing is asked
    with contextlib.suppress(socket.gaierror):
        socket.getaddrinfo(host, 2575, flags=socket.AI_NUMERICHOST)
