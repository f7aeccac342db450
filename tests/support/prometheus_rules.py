"""The chart's PrometheusRule as Prometheus reads it, and ``promtool`` run on it.

Tests import it (``from tests.support.prometheus_rules import ...``) and ``make lint`` runs it
as a module from the repository's root::

    .venv/bin/python -m tests.support.prometheus_rules check   # promtool check rules

The rules are rendered by the real Helm (:mod:`tests.support.helm_chart`) with the chart's
defaults and everything that adds an alert switched on (:data:`RULES_VALUES`); the
PrometheusRule's ``spec`` is a Prometheus rule file as it stands (``groups:``), which is what the
Prometheus Operator hands to Prometheus.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests.support.helm_chart import find, render

#: promtool from Debian's ``prometheus`` package (``.ci/run`` installs it when missing).
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
#: Values under which every alert of the chart renders: the rule on, and the sweeper and purge
#: CronJobs and the operator (each adds its own alert) on.
RULES_VALUES: dict[str, Any] = {
    "monitoring": {"prometheusRule": {"enabled": True}},
    "operator": {"enabled": True},
    "sweeper": {"enabled": True},
    "purge": {"enabled": True},
}


def rule_file(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The PrometheusRule's ``spec`` (``{"groups": [...]}``) rendered with :data:`RULES_VALUES`
    and ``overrides``."""
    values = {**RULES_VALUES, **(overrides or {})}
    rule = find(render(values), "PrometheusRule", "inturn")
    spec: dict[str, Any] = rule["spec"]
    return spec


def alerts(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every alerting rule of a rule file, in order."""
    return [r for g in spec["groups"] for r in g["rules"] if "alert" in r]


def write(spec: dict[str, Any], path: Path) -> Path:
    """Write a rule file as YAML; return ``path``."""
    path.write_text(yaml.safe_dump(spec, sort_keys=False, width=1000))
    return path


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``promtool args...``; the completed process (output captured, not checked).

    Raises:
        FileNotFoundError: promtool is not installed (``apt-get install prometheus``).
    """
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def check() -> int:
    """``promtool check rules`` on the rendered rules; print its output; its exit code."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write(rule_file(), Path(tmp) / "rules.yaml")
        try:
            done = promtool("check", "rules", str(path))
        except FileNotFoundError:
            print(f"{PROMTOOL} not found: apt-get install prometheus", file=sys.stderr)
            return 1
    print(done.stdout + done.stderr, end="")
    return done.returncode


if __name__ == "__main__":
    if sys.argv[1:] != ["check"]:
        sys.exit("usage: prometheus_rules.py check")
    sys.exit(check())
