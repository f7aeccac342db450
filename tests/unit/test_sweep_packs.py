"""The sweeper's rule packs: the registry, and a pack's options only where the pack runs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from inturn.worker.cli import cli
from inturn.worker.cli.sweep import only_values
from inturn.worker.feeds import rules as feed_rules
from inturn.worker.operations import packs
from inturn.worker.orders import rules as order_rules
from inturn.worker.reservations import sweep as reservation_rules
from inturn.worker.worklist import delivery_rules

#: Words of the airline rules that a hospital's sweep must never show.
AIRLINE_WORDS = ("carrier", "ticketing", "pending-after", "auto-cancel", "INTURN_SWEEP_")


def test_packs_are_objects_listed_once() -> None:
    assert packs.PACKS == (
        delivery_rules.PACK,
        feed_rules.PACK,
        order_rules.PACK,
        reservation_rules.PACK,
    )
    assert packs.names() == ("delivery", "feeds", "orders", "reservations")
    assert packs.get("reservations") is reservation_rules.PACK
    with pytest.raises(packs.UnknownPack, match="unknown rule pack nope; expected one of"):
        packs.get("nope")


def test_a_plain_sweep_runs_the_default_packs_and_only_names_the_others() -> None:
    assert packs.chosen() == (delivery_rules.PACK, feed_rules.PACK, order_rules.PACK)
    assert [r.name for r in packs.select()] == [
        "destination-stuck",
        "orphaned-queue",
        "delivery-expired",
        "resent-delivered",
        "feed-silent",
        "unanswered-order",
    ]
    assert packs.chosen(("reservations", "delivery")) == (  # run order, not asked order
        delivery_rules.PACK,
        reservation_rules.PACK,
    )
    with pytest.raises(packs.UnknownPack, match="unknown rule pack nope, zz"):
        packs.chosen(("zz", "nope", "delivery"))


def test_settings_reach_the_rules_of_their_pack() -> None:
    rules = packs.select(
        ("reservations",),
        {"reservations": {"pending_after": 60, "auto_cancel": True, "host_carriers": ("LH",)}},
    )
    by_name = {r.name: r.run for r in rules}
    assert by_name["unanswered"].keywords == {"pending_after": 60}  # type: ignore[attr-defined]
    assert by_name["ticketing-expired"].keywords == {  # type: ignore[attr-defined]
        "ticketing_lead": reservation_rules.DEFAULT_TICKETING_LEAD,
        "auto_cancel": True,
        "host_carriers": ("LH",),
    }
    with pytest.raises(TypeError):
        packs.select(("reservations",), {"reservations": {"no_such_setting": 1}})


def test_a_plain_sweep_help_names_no_airline_setting() -> None:
    out = CliRunner().invoke(cli, ["sweep", "--help"])
    assert out.exit_code == 0, out.output
    assert "--only PACK" in out.output and "reservations" in out.output
    assert [w for w in AIRLINE_WORDS if w in out.output] == []


def test_the_reservation_options_show_when_the_pack_is_asked_for() -> None:
    for args in (["--only", "reservations"], ["--only=reservations"]):
        out = CliRunner().invoke(cli, ["sweep", *args, "--help"])
        assert out.exit_code == 0, out.output
        for flag in ("--pending-after", "--ticketing-lead", "--auto-cancel", "--host-carrier"):
            assert flag in out.output
        assert "INTURN_SWEEP_HOST_CARRIERS" in out.output


def test_a_pack_option_without_its_pack_is_a_usage_error() -> None:
    out = CliRunner().invoke(cli, ["sweep", "--host-carrier", "LH"])
    assert out.exit_code == 2 and "No such option '--host-carrier'" in out.output
    out = CliRunner().invoke(cli, ["sweep", "--only", "reservations", "--host-carrier", "bad!"])
    assert out.exit_code == 2 and "is not an IATA airline designator" in out.output


def test_only_values_reads_both_spellings_and_stops_at_double_dash() -> None:
    assert only_values(["--only", "a", "--only=b", "--dry-run", "--", "--only", "c"]) == ["a", "b"]
    assert only_values(["--only"]) == []
