"""The chart ships its files/ as they are: the PrometheusRule carries the rule groups of
files/alerts/ unchanged (next to the chart's own Kubernetes workload group), and one
dashboard ConfigMap per dashboard of grafana/dashboards/ holds that dashboard unchanged
(files/dashboards/ is the chart's copy of them, byte for byte: `make dashboards`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devtools import grafana
from tests.chart.conftest import CHART, RELEASE, by_kind, find, render, render_error

pytestmark = pytest.mark.chart

PRODUCTION = CHART / "ci" / "production-values.yaml"


def test_prometheus_rule_renders_the_rule_groups_of_its_alert_files() -> None:
    (rule,) = by_kind(render([PRODUCTION]), "PrometheusRule")
    groups = rule["spec"]["groups"]
    source = grafana.load_rule_groups()
    assert groups[: len(source)] == source
    assert [g["name"] for g in groups[len(source) :]] == ["notes-exports.workloads"]
    names = [g["name"] for g in groups]
    assert len(names) == len(set(names)), "duplicate rule group names"
    alerts = [r["alert"] for g in groups for r in g["rules"] if "alert" in r]
    assert len(alerts) == len(set(alerts)), "an alert is defined twice"
    assert set(grafana.alert_names()) <= set(alerts)


def test_metrics_prometheus_rule_for_overrides_one_alerts_for() -> None:
    sets = {"metrics.prometheusRule.for.NotesExportsOutboxStuck": "30s"}
    (rule,) = by_kind(render([PRODUCTION], sets), "PrometheusRule")
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert rules["NotesExportsOutboxStuck"]["for"] == "30s"
    source = {r["alert"]: r for g in grafana.load_rule_groups() for r in g["rules"] if "alert" in r}
    assert source["NotesExportsOutboxStuck"]["for"] == "5m"
    # every other alert as its file has it
    for name, r in source.items():
        if name != "NotesExportsOutboxStuck":
            assert rules[name] == r, name


def test_metrics_prometheus_rule_for_names_an_alert_and_a_duration() -> None:
    err = render_error([PRODUCTION], {"metrics.prometheusRule.for.NotesExportsOutboxStuk": "1m"})
    assert '"NotesExportsOutboxStuk" is not an alert of files/alerts/' in err
    assert "NotesExportsOutboxStuck" in err  # the known names are listed
    err = render_error([PRODUCTION], {"metrics.prometheusRule.for.NotesExportsOutboxStuck": "soon"})
    assert "does not match pattern" in err and "/metrics/prometheusRule/for" in err


def test_the_chart_ships_the_dashboards_of_grafana_byte_for_byte() -> None:
    # Helm reads no file outside the chart: files/dashboards/ is a copy of grafana/dashboards/
    # (the one source, which a standalone Grafana's provisioning reads), kept by this test.
    assert grafana.dashboard_files(), "grafana/dashboards/ holds no dashboard"
    assert grafana.DASHBOARDS.parent == grafana.ROOT / "grafana"
    differences = grafana.chart_dashboard_differences()
    assert not differences, (
        "the chart's copy of the dashboards differs from grafana/dashboards/ (edit the "
        "dashboards there, then `make dashboards`): " + "; ".join(differences)
    )


def test_dashboards_sync_makes_the_chart_copy_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, copy = tmp_path / "grafana", tmp_path / "chart"
    source.mkdir()
    copy.mkdir()
    (source / "a.json").write_text('{"uid": "a"}\n')
    (source / "b.json").write_text('{"uid": "b"}\n')
    (copy / "a.json").write_text('{"uid": "a", "edited": "in the chart"}\n')
    (copy / "gone.json").write_text("{}\n")
    monkeypatch.setattr(grafana, "DASHBOARDS", source)
    monkeypatch.setattr(grafana, "CHART_DASHBOARDS", copy)
    assert grafana.chart_dashboard_differences() == [
        "b.json: missing from the chart",
        "gone.json: only in the chart",
        "a.json: differs from grafana/dashboards/a.json",
    ]
    assert len(grafana.sync_chart_dashboards()) == 3
    assert grafana.chart_dashboard_differences() == []
    assert sorted(p.name for p in copy.iterdir()) == ["a.json", "b.json"]


def test_dashboard_config_maps_hold_the_dashboards_of_grafana() -> None:
    objs = render([PRODUCTION])
    for path in grafana.dashboard_files():
        cm = find(objs, "ConfigMap", f"{RELEASE}-notes-exports-dashboard-{path.stem}")
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"]["grafana_folder"] == "notes-exports"
        assert json.loads(cm["data"][path.name]) == json.loads(path.read_text())
    # the chart's own workload dashboard stays, and nothing else
    boards = {
        o["metadata"]["name"]
        for o in by_kind(objs, "ConfigMap")
        if "grafana_dashboard" in o["metadata"]["labels"]
    }
    assert boards == {
        f"{RELEASE}-notes-exports-dashboard-{stem}"
        for stem in ["workloads", *(p.stem for p in grafana.dashboard_files())]
    }
    uids = [
        json.loads(text)["uid"]
        for o in by_kind(objs, "ConfigMap")
        if "grafana_dashboard" in o["metadata"]["labels"]
        for text in o["data"].values()
    ]
    assert len(uids) == len(set(uids))


def test_rules_and_dashboards_are_off_unless_enabled() -> None:
    objs = render([CHART / "ci" / "default-values.yaml"])
    assert by_kind(objs, "PrometheusRule") == []
    assert not [
        o for o in by_kind(objs, "ConfigMap") if "grafana_dashboard" in o["metadata"]["labels"]
    ]
