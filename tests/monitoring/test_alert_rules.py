"""The chart's alert rules, tested as Prometheus tests them: ``promtool test rules``.

``rules-test.yaml`` beside this file holds the unit tests (input series, the alert that must
fire and when, the one that must not); here the rules are rendered by the real Helm, written
next to a copy of it, and promtool runs them. Every alert of the rendered rules must be tested
there both firing and silent, and name its section of the runbook.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.prometheus_rules import PROMTOOL, alerts, promtool, rule_file, write

HERE = Path(__file__).resolve().parent
TESTS = HERE / "rules-test.yaml"
ROOT = HERE.parents[1]

# .ci/run installs Prometheus and sets INTURN_REQUIRE_PROMETHEUS: there a missing promtool fails.
pytestmark = pytest.mark.skipif(
    shutil.which(PROMTOOL) is None and not os.environ.get("INTURN_REQUIRE_PROMETHEUS"),
    reason="no promtool (apt-get install prometheus)",
)


def test_the_rules_pass_promtool_check(tmp_path: Path) -> None:
    done = promtool("check", "rules", str(write(rule_file(), tmp_path / "rules.yaml")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout


def test_every_alert_fires_and_stays_silent_as_its_unit_tests_say(tmp_path: Path) -> None:
    write(rule_file(), tmp_path / "rules.yaml")
    shutil.copy(TESTS, tmp_path / "rules-test.yaml")
    done = promtool("test", "rules", "rules-test.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases: dict[str, list[bool]] = {}
    for test in yaml.safe_load(TESTS.read_text())["tests"]:
        for case in test["alert_rule_test"]:
            cases.setdefault(case["alertname"], []).append(bool(case["exp_alerts"]))
    names = {a["alert"] for a in alerts(rule_file())}
    assert set(cases) == names
    for name, fires in cases.items():
        assert True in fires and False in fires, name


def test_a_rule_that_changes_is_caught_by_its_unit_test(tmp_path: Path) -> None:
    """The unit tests are not vacuous: a threshold moved by a value makes promtool fail."""
    write(
        rule_file(
            {"monitoring": {"prometheusRule": {"enabled": True, "oldestPendingSeconds": 60}}}
        ),
        tmp_path / "rules.yaml",
    )
    shutil.copy(TESTS, tmp_path / "rules-test.yaml")
    done = promtool("test", "rules", "rules-test.yaml", cwd=tmp_path)
    assert done.returncode != 0
    assert "InturnOldestPendingTooOld" in done.stdout + done.stderr


def test_each_alert_names_its_runbook_section() -> None:
    """``runbook_url`` is ``runbookUrl#<alert in lower case>`` and that section exists."""
    url = "https://docs.example.test/runbook.html"
    spec = rule_file({"monitoring": {"prometheusRule": {"enabled": True, "runbookUrl": url}}})
    runbook = (ROOT / "docs" / "howto" / "runbook.md").read_text()
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", runbook, flags=re.M)
    }
    for alert in alerts(spec):
        anchor = alert["alert"].lower()
        assert alert["annotations"]["runbook_url"] == f"{url}#{anchor}"
        assert anchor in headings, f"no runbook section for {alert['alert']}"
