"""The chart's monitoring extras: the Grafana dashboard as a ConfigMap for Grafana's sidecar (off
by default, carrying ``charts/inturn/dashboards/inturn.json`` unchanged), and the OpenTelemetry
variables of ``tracing.env`` for ingest and every worker."""

from __future__ import annotations

import json

import pytest

from tests.support.helm_chart import CHART, find, lint, of_kind, render

DASHBOARD = CHART / "dashboards" / "inturn.json"


def test_off_by_default() -> None:
    assert not [c for c in of_kind(render(), "ConfigMap") if "dashboard" in c["metadata"]["name"]]


def test_on_it_is_a_configmap_labelled_for_the_sidecar() -> None:
    objs = render({"monitoring": {"grafanaDashboard": {"enabled": True}}})
    cm = find(objs, "ConfigMap", "inturn-dashboard", "inturn")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["inturn.json"]) == json.loads(DASHBOARD.read_text())


def test_namespace_labels_and_annotations_follow_the_values() -> None:
    objs = render(
        {
            "monitoring": {
                "grafanaDashboard": {
                    "enabled": True,
                    "namespace": "monitoring",
                    "labels": {"dashboards": "inturn"},
                    "annotations": {"grafana_folder": "HL7"},
                }
            }
        }
    )
    cm = find(objs, "ConfigMap", "inturn-dashboard", "monitoring")
    assert cm["metadata"]["labels"]["dashboards"] == "inturn"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"  # maps merge, as Helm does
    assert cm["metadata"]["annotations"] == {"grafana_folder": "HL7"}
    assert lint({"monitoring": {"grafanaDashboard": {"enabled": True}}}) == []


def test_a_misspelt_value_is_refused_by_the_schema() -> None:
    import helm_python

    with pytest.raises(helm_python.HelmValuesError):
        render({"monitoring": {"grafanaDashboard": {"enable": True}}})


def test_every_panel_query_is_promql_on_the_chosen_datasource() -> None:
    """Each panel reads the dashboard's ``$datasource`` variable; rows hold no queries."""
    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert panels
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]


def test_tracing_variables_reach_ingest_and_every_worker() -> None:
    endpoint = "http://otel-collector.monitoring:4318"
    objs = render({"tracing": {"env": {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}}})
    ingest = find(objs, "Deployment", "inturn-ingest")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in ingest["containers"][0]["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == endpoint
    operator = find(objs, "Deployment", "inturn-operator")["spec"]["template"]["spec"]
    assert (
        f"--worker-env=OTEL_EXPORTER_OTLP_ENDPOINT={endpoint}" in operator["containers"][0]["args"]
    )
    off = find(render(), "Deployment", "inturn-ingest")["spec"]["template"]["spec"]
    assert not [e for e in off["containers"][0]["env"] if e["name"].startswith("OTEL_")]


def test_only_otel_variables_are_taken() -> None:
    import helm_python

    with pytest.raises(helm_python.HelmValuesError):
        render({"tracing": {"env": {"PATH": "/tmp"}}})
