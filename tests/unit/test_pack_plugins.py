"""Rule packs plug in (issue 32, item 4): found through the entry-point group ``inturn.packs``,
and a pack whose extra is not installed is absent: a hospital install (no ``airportsdata``)
has no ``bookings`` command, no reservation options and never imports the library."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from inturn.worker.feeds import rules as feed_rules
from inturn.worker.operations import packs
from inturn.worker.orders import rules as order_rules
from inturn.worker.reservations import sweep as reservation_rules
from inturn.worker.worklist import delivery_rules
from inturn.worker.worklist.pack import ENTRY_POINT_GROUP, Pack

#: ``inturn ARGS`` in a process where ``airportsdata`` cannot be imported, as on an install
#: without the reservations extra (a finder refuses it, as a missing distribution would).
HOSPITAL = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "airportsdata":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Refuse())
from inturn.worker.cli import cli
try:
    cli(sys.argv[1:], prog_name="inturn")
finally:
    assert "airportsdata" not in sys.modules
"""

#: Words of the airline pack that a hospital's command line must never show.
AIRLINE_WORDS = ("bookings", "carrier", "ticketing", "pending-after", "auto-cancel")


def hospital(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", HOSPITAL, *args], capture_output=True, text=True, timeout=60
    )


def test_the_packs_are_the_entry_points_of_one_group() -> None:
    named = {p.name: p.value for p in entry_points(group=ENTRY_POINT_GROUP)}
    assert named == {
        "delivery": "inturn.worker.worklist.delivery_rules:PLUGIN",
        "feeds": "inturn.worker.feeds.rules:PLUGIN",
        "orders": "inturn.worker.orders.rules:PLUGIN",
        "reservations": "inturn.worker.reservations.sweep:PLUGIN",
    }
    assert packs.PLUGINS == (
        delivery_rules.PLUGIN,
        feed_rules.PLUGIN,
        order_rules.PLUGIN,
        reservation_rules.PLUGIN,
    )
    assert packs.INACTIVE == {}
    assert packs.commands() == {"bookings": "inturn.worker.cli.reservations:bookings_group"}


def test_a_pack_whose_module_is_missing_says_which_extra_installs_it() -> None:
    pack = Pack(name="cargo", requires=("inturn_no_such_module", "json"), extra="cargo")
    assert pack.missing() == ["inturn_no_such_module"]
    assert pack.install_hint() == "pip install 'inturn[cargo]'"
    assert Pack(name="x", requires=("json",)).missing() == []


def test_a_hospital_install_has_no_bookings_command_and_no_airline_options() -> None:
    listed = hospital("--help")
    assert listed.returncode == 0, listed.stderr
    assert "bookings" not in listed.stdout and "sweep" in listed.stdout
    swept = hospital("sweep", "--help")
    assert swept.returncode == 0, swept.stderr
    assert not [w for w in AIRLINE_WORDS if w in swept.stdout]
    asked = hospital("bookings", "show", "ABC123")
    assert asked.returncode == 1
    assert asked.stderr.strip().splitlines() == [
        "Error: inturn bookings is the reservations pack's, not installed here:"
        " pip install 'inturn[reservations]'"
    ]
    only = hospital("sweep", "--only", "reservations", "--dry-run")
    assert only.returncode == 2
    assert "reservations is not installed: pip install 'inturn[reservations]'" in only.stderr


def test_with_the_extra_the_pack_is_there() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from inturn.worker.cli import cli; cli(['--help'])"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "bookings" in done.stdout


def test_the_packs_declare_their_spec_fields_and_the_schema_takes_them() -> None:
    from inturn.worker.orders.fields import REPLIES
    from inturn.worker.reservations.fields import CARRIERS, RULE_CARRIERS_DISTINCT
    from inturn.worker.spec import schema
    from inturn.worker.spec.schema_packs import pack_fields

    assert order_rules.PLUGIN.spec_fields == (REPLIES,)
    assert reservation_rules.PLUGIN.spec_fields == (CARRIERS,)
    assert pack_fields() == (REPLIES, CARRIERS)  # pack name order
    spec = schema.spec_schema()
    assert list(spec["properties"])[-2:] == ["replies", "carriers"]
    assert spec["properties"]["carriers"] == CARRIERS.schema()
    assert spec["x-kubernetes-validations"][-1] == RULE_CARRIERS_DISTINCT.as_cel()
    worker = schema.worker_config_schema()["properties"]
    assert worker["replies"] == REPLIES.schema() and worker["carriers"] == CARRIERS.schema()


def test_the_orders_pack_s_hooks_apply_only_where_spec_replies_does() -> None:
    from inturn.worker.orders import keys
    from inturn.worker.spec.config import from_dict
    from inturn.worker.spec.replies import key_digest, owner_scope, rules_of
    from inturn.worker.worklist.hooks import Answers, Registered

    rule = {
        "orderTypes": ["ORM^O01"],
        "replyTypes": ["ORU^R01"],
        "channel": "results",
        "withinSeconds": 3600,
    }
    doc = {
        "destination": "lab/lis",
        "channel": "orders",
        "sender": {"mllp": {"host": "lis", "port": 2575}},
        "retry": {"maxAttempts": 0},
    }
    plain = from_dict(doc)
    assert keys.marker(plain, key_digest) is None  # no spec.replies: nothing per message
    assert packs.marker(plain, key_digest) is None
    opened = packs.marker(from_dict({**doc, "replies": [rule]}), key_digest)
    assert opened is not None
    owner = owner_scope("lab/lis", rules_of([rule])[0].order_peer("LIS", "L"))
    order = b"MSH|^~\\&|HIS|H|LIS|L|20260101||ORM^O01|O1|P|2.5\rORC|NW|K1\r"
    assert [(e.key, e.digest, e.channel) for e in opened("ORM^O01", order)] == [
        ("K1", key_digest(owner, "K1"), "results")
    ]
    assert list(opened("ADT^A01", order)) == []

    table = packs.answerers(
        [Registered("lab/lis", "orders", {"replies": [rule]}), Registered("a/b", "adt", {})]
    )
    assert set(table) == {"results"}  # the channel replies arrive on, nothing else
    reply = b"MSH|^~\\&|LIS|L|HIS|H|20260101||ORU^R01|R1|P|2.5\rORC|RE|K1\r"
    found = packs.answer(table["results"], "ORU^R01", reply, [key_digest])
    assert found == Answers((key_digest(owner, "K1"),), True)
    assert packs.answer(table["results"], "ADT^A08", reply, [key_digest]) is None


def test_answers_of_several_packs_add_up_and_a_broken_hook_counts_as_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from inturn.worker.worklist.hooks import Answers

    def broken(message_type: str, payload: bytes, digests: object) -> Answers | None:
        raise RuntimeError("a bug in a plug-in")

    first = Answers(("b", "a"), reply=False)
    answering = (
        lambda t, p, d: first,
        broken,
        lambda t, p, d: None,
        lambda t, p, d: Answers(("c", "a"), reply=True),
    )
    assert packs.answer(answering, "ORU^R01", b"", []) == Answers(("a", "b", "c"), True)
    assert "a rule pack's ingest hook failed on a ORU^R01 message" in caplog.text
    assert packs.answer((broken,), "ORU^R01", b"", []) is None


def test_the_feeds_pack_records_for_ingest_only_when_feeds_are_declared() -> None:
    from inturn.worker.feeds.declare import Feed
    from inturn.worker.feeds.recorder import FeedRecorder
    from inturn.worker.worklist.hooks import IngestOptions

    assert feed_rules.PLUGIN.record is not None
    assert packs.recorder(IngestOptions(feeds=None, max_feed_senders=7)) is None
    found = packs.recorder(
        IngestOptions(feeds=(Feed("adt", 600, per_sender=True),), max_feed_senders=7)
    )
    assert isinstance(found, FeedRecorder)
    assert (set(found.feeds), found.max_senders) == ({"adt"}, 7)
    found.seen("adt", "LAB^x", "H")
    found.seen("orm", "LAB", "H")  # not declared: not noted
    assert [(c, s) for c, s, _ in found.take()] == [("adt", ""), ("adt", "LAB^H")]


class Noting:
    """A recorder that keeps what it was told (a pack of this test's own)."""

    def __init__(self, fails: bool = False) -> None:
        self.noted: list[tuple[str, str, str]] = []
        self.fails = fails

    def seen(self, channel: str, sending_application: str, sending_facility: str) -> None:
        self.noted.append((channel, sending_application, sending_facility))

    async def declare(self, pool: object) -> None:
        return None

    async def flush(self, pool: object) -> int:
        if self.fails:
            raise OSError("database away")
        written, self.noted = len(self.noted), []
        return written

    async def run(self, pool: object, every: float) -> None:
        return None

    async def close(self, pool: object) -> None:
        return None


def test_recorders_of_several_packs_are_one_and_a_broken_hook_is_left_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    from inturn.worker.worklist.hooks import IngestOptions

    def broken(options: IngestOptions) -> None:
        raise RuntimeError("a bug in a plug-in")

    first, second = Noting(), Noting(fails=True)
    plugins = (
        Pack(name="a", record=lambda o: first),
        Pack(name="b", record=broken),
        Pack(name="c", record=lambda o: None),
        Pack(name="d", record=lambda o: second),
    )
    monkeypatch.setattr(packs, "PLUGINS", plugins)
    options = IngestOptions(feeds=None, max_feed_senders=100)
    both = packs.recorder(options)
    assert both is not None
    assert "rule pack b: its record hook failed; left out" in caplog.text
    both.seen("adt", "LAB", "H")
    assert first.noted == second.noted == [("adt", "LAB", "H")]
    with pytest.raises(OSError, match="database away"):  # raised after every flush ran
        asyncio.run(both.flush(None))  # type: ignore[arg-type]
    assert (first.noted, second.noted) == ([], [("adt", "LAB", "H")])
    monkeypatch.setattr(packs, "PLUGINS", plugins[:1])
    assert packs.recorder(options) is first  # one pack: its own recorder, nothing between
    monkeypatch.setattr(packs, "PLUGINS", plugins[1:3])
    assert packs.recorder(options) is None
