"""Every rendered object validates against a published schema; nothing is skipped.

- built-in objects: ``kubernetes-validate --strict`` (unknown fields rejected) against
  Kubernetes 1.29 (the chart's minimum) and the newest version the package ships;
- ServiceMonitor / PrometheusRule / ScaledObject / TriggerAuthentication: the schemas published in the npm packages
  @kubernetes-models/prometheus-operator and @kubernetes-models/keda (``make schema-tools``);
- the PromQL of the alert rules and of the dashboards: ``promtool check rules``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate.utils
import pytest
import yaml

from devtools import grafana
from devtools.stack import ROOT
from tests.chart.conftest import CHART, NPM_MODULES, by_kind, render

pytestmark = pytest.mark.chart

BIN = Path(sys.executable).parent
CUSTOM = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
}
VALIDATOR = ROOT / "tests" / "chart" / "crd-schemas" / "validate.mjs"
K8S_VERSIONS = sorted({"1.29.0", kubernetes_validate.utils.latest_version()})


def _builtin(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if (o["apiVersion"], o["kind"]) not in CUSTOM]


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
def test_builtin_objects_validate_strictly(scenario, k8s_version: str, tmp_path: Path) -> None:
    path, objs = scenario
    files = []
    for i, obj in enumerate(_builtin(objs)):
        f = tmp_path / f"{i:02d}-{obj['kind']}-{obj['metadata']['name']}.yaml"
        f.write_text(yaml.safe_dump(obj))
        files.append(str(f))
    assert files
    proc = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "-k", k8s_version, *files],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"{path.name} on {k8s_version}:\n{proc.stdout}\n{proc.stderr}"
    # Every object was really checked (a resource without a schema only warns).
    passed = proc.stdout.count(" passed for resource ")
    assert passed == len(files), proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("manifest", "objects"),
    [("dev-deps.yaml", 6), ("minio.yaml", 4)],
)
def test_dev_dependency_manifests_validate_strictly(manifest: str, objects: int) -> None:
    for version in K8S_VERSIONS:
        proc = subprocess.run(
            [
                str(BIN / "kubernetes-validate"),
                "--strict",
                "-k",
                version,
                str(ROOT / "k8s" / manifest),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0 and "FAILED" not in proc.stdout, proc.stdout + proc.stderr
        assert proc.stdout.count(" passed for resource ") == objects, proc.stdout


def validate_custom(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is required to run the published CRD schemas (apt-get install nodejs)")
    if not (NPM_MODULES / "@kubernetes-models" / "keda").is_dir():
        pytest.fail(f"{NPM_MODULES} lacks the schema packages: run `make schema-tools`")
    proc = subprocess.run(
        [node, str(VALIDATOR), str(NPM_MODULES)],
        input=json.dumps(objs),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.stdout, proc.stderr
    results: list[dict[str, Any]] = json.loads(proc.stdout)
    assert len(results) == len(objs)
    return results


def test_custom_resources_validate_against_published_schemas() -> None:
    objs = render([CHART / "ci" / "production-values.yaml"])
    custom = [o for o in objs if (o["apiVersion"], o["kind"]) in CUSTOM]
    assert {o["kind"] for o in custom} == {
        "ServiceMonitor",
        "PrometheusRule",
        "ScaledObject",
        "TriggerAuthentication",
    }
    results = validate_custom(custom)
    bad = [r for r in results if not r["valid"]]
    assert bad == [], json.dumps(bad, indent=1)
    assert all(r["schema"] for r in results)


def test_the_crd_validator_really_rejects_invalid_resources() -> None:
    objs = render([CHART / "ci" / "production-values.yaml"])
    scaled = json.loads(json.dumps(by_kind(objs, "ScaledObject")[0]))
    scaled["spec"]["minReplicaCount"] = "two"
    del scaled["spec"]["triggers"][0]["type"]
    monitor = json.loads(json.dumps(by_kind(objs, "ServiceMonitor")[0]))
    monitor["spec"]["endpoints"] = "http"
    rule = json.loads(json.dumps(by_kind(objs, "PrometheusRule")[0]))
    del rule["spec"]["groups"][0]["name"]
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    results = validate_custom([scaled, monitor, rule, unknown])
    assert [r["valid"] for r in results] == [False, False, False, False]
    paths = {e["instancePath"] for e in results[0]["errors"]}
    assert "/spec/minReplicaCount" in paths
    assert results[3]["schema"] is None


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is required (apt-get install prometheus; `make test` installs it)")
    return tool


def _promtool_check_rules(groups: list[dict[str, Any]], rules_file: Path) -> str:
    """``promtool check rules`` on ``groups`` written to ``rules_file`` (YAML); fails the test
    when promtool rejects them, and returns its stdout."""
    rules_file.write_text(yaml.safe_dump({"groups": groups}))
    proc = subprocess.run(
        [_promtool(), "check", "rules", str(rules_file)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_alert_rules_pass_promtool(tmp_path: Path) -> None:
    objs = render(
        [CHART / "ci" / "production-values.yaml"],
        {
            "metrics.prometheusRule.additionalRules[0].alert": "ExtraRule",
            "metrics.prometheusRule.additionalRules[0].expr": "vector(1) > 2",
        },
    )
    (rule,) = by_kind(objs, "PrometheusRule")
    out = _promtool_check_rules(rule["spec"]["groups"], tmp_path / "rules.yaml")
    all_rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    alerts = [r["alert"] for r in all_rules if "alert" in r]
    assert "ExtraRule" in alerts and len(alerts) >= 5
    assert f"SUCCESS: {len(all_rules)} rules found" in out


def test_dashboard_queries_parse_with_promtool(tmp_path: Path) -> None:
    objs = render([CHART / "ci" / "production-values.yaml"])
    boards = [
        json.loads(text)
        for cm in by_kind(objs, "ConfigMap")
        if "grafana_dashboard" in cm["metadata"]["labels"]
        for text in cm["data"].values()
    ]
    exprs = []
    for board in boards:
        consts = {
            v["name"]: v["query"] for v in board["templating"]["list"] if v["type"] == "constant"
        }
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = grafana.substitute(target["expr"], consts)
                assert "$" not in expr, f"unresolved variable in {expr}"
                exprs.append(expr)
    assert exprs
    records = [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)]
    _promtool_check_rules(
        [{"name": "dashboards", "rules": records}], tmp_path / "dashboard-queries.yaml"
    )


def test_strict_validation_really_rejects_unknown_fields(tmp_path: Path) -> None:
    objs = render([CHART / "ci" / "default-values.yaml"])
    deployment = json.loads(json.dumps(by_kind(objs, "Deployment")[0]))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    f = tmp_path / "typo.yaml"
    f.write_text(yaml.safe_dump(deployment))
    proc = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "-k", "1.29.0", str(f)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and "livenessProbes" in proc.stdout + proc.stderr
