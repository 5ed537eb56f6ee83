"""The Prometheus rules of charts/notes-exports/files/alerts/: valid for promtool, unit-tested by promtool for
every alert (a case that fires with its labels and annotations, a case that stays quiet),
written against the metric catalogue, and never tied to a scrape job."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import grafana
from tests.grafana.support import check_against_catalogue, grouping_labels, promtool

pytestmark = pytest.mark.grafana

SEVERITIES = {"critical", "warning"}
ANNOTATIONS = {"summary", "description", "runbook"}


def load_tests() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for path in grafana.rule_test_files():
        doc = yaml.safe_load(path.read_text())
        # the unit tests read the chart's rule files themselves
        assert {(path.parent / f).resolve() for f in doc["rule_files"]} == {
            p.resolve() for p in grafana.rule_files()
        }
        cases.extend(doc["tests"])
    return cases


def alert_checks() -> list[dict[str, Any]]:
    return [check for case in load_tests() for check in case.get("alert_rule_test", [])]


def test_promtool_check_rules() -> None:
    files = grafana.rule_files()
    assert [p.name for p in files] == ["exports.rules.yaml"]
    proc = promtool("check", "rules", *files)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(grafana.rules())} rules found" in proc.stdout


def test_promtool_test_rules() -> None:
    files = grafana.rule_test_files()
    assert files
    proc = promtool("test", "rules", *files)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout and "FAILED" not in proc.stdout


def test_the_alerts_of_the_brief_exist() -> None:
    assert set(grafana.alert_names()) == {
        "NotesExportsOutboxStuck",
        "NotesExportsBacklogAgeHigh",
        "NotesExportsBacklogAgeCritical",
        "NotesExportsDeadLettersRising",
        "NotesExportsDispatchPausedTooLong",
        "NotesExportsExpiredLeasesPersisting",
        "NotesExportsScannerStalled",
        "NotesExportsDatabaseGaugesDown",
        "NotesExportsDatabaseGaugesAbsent",
        "NotesExportsRecoverySLOBurnFast",
        "NotesExportsRecoverySLOBurnSlow",
        "NotesExportsTenantStarved",
        "NotesExportsWebhookEndpointFailing",
        "NotesExportsWebhookEndpointDisabled",
    }


def test_every_alert_has_a_severity_summary_description_and_runbook() -> None:
    for rule in grafana.rules():
        if "alert" not in rule:
            assert rule["record"].startswith("exports:"), rule
            continue
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert set(rule["annotations"]) == ANNOTATIONS, rule["alert"]
        assert all(len(v) > 20 for v in rule["annotations"].values()), rule["alert"]
        assert re.fullmatch(r"NotesExports[A-Z][A-Za-z]+", rule["alert"])


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    checks = alert_checks()
    rules = {r["alert"]: r for r in grafana.rules() if "alert" in r}
    for name, rule in rules.items():
        mine = [c for c in checks if c["alertname"] == name]
        firing = [c for c in mine if c.get("exp_alerts")]
        quiet = [c for c in mine if not c.get("exp_alerts")]
        assert firing, f"{name}: no promtool case where it fires"
        assert quiet, f"{name}: no promtool case where it stays quiet"
        for check in firing:
            for alert in check["exp_alerts"]:
                # the severity and every annotation are checked, not only the name
                assert alert["exp_labels"]["severity"] == rule["labels"]["severity"]
                assert set(alert["exp_annotations"]) == ANNOTATIONS
    assert {c["alertname"] for c in checks} <= set(rules), "a test names an unknown alert"


def test_the_unit_tests_catch_an_alert_that_never_fires(tmp_path: Path) -> None:
    """Replace one alert's expression by one that is never true: promtool test must fail,
    naming that alert (so each alert's firing case really exercises it)."""
    source = yaml.safe_load(grafana.rule_files()[0].read_text())
    for name in grafana.alert_names():
        doc = yaml.safe_load(yaml.safe_dump(source))
        for group in doc["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") == name:
                    rule["expr"] = "vector(0) > 1"
        (tmp_path / "alerts").mkdir(exist_ok=True)
        (tmp_path / "alerts" / "exports.rules.yaml").write_text(yaml.safe_dump(doc))
        (tmp_path / "tests").mkdir(exist_ok=True)
        for test_file in grafana.rule_test_files():
            (tmp_path / "tests" / test_file.name).write_text(test_file.read_text())
        proc = promtool("test", "rules", *sorted((tmp_path / "tests").glob("*.yaml")))
        assert proc.returncode != 0, f"{name} never fires, yet the unit tests pass"
        assert f"alertname: {name}," in proc.stdout + proc.stderr, proc.stderr


def test_rules_use_the_metric_catalogue_and_no_scrape_job() -> None:
    exprs = grafana.rule_expressions()
    records = {name: grouping_labels(expr) for name, expr in exprs if name.startswith("exports:")}
    for name, expr in exprs:
        assert check_against_catalogue(expr, records) == [], name
        assert not re.search(r"\b(job|instance|component|pod|namespace)\b", expr), name


def test_inlined_rule_expressions_need_no_recording_rule() -> None:
    inlined = dict(grafana.rule_expressions(inline_records=True))
    assert set(inlined) == {n for n, _ in grafana.rule_expressions()}
    for name, expr in inlined.items():
        assert "exports:" not in expr, name
    assert "exports_recovery_seconds_bucket" in inlined["NotesExportsRecoverySLOBurnFast"]
