"""helm lint and helm template for every ci/*-values.yaml, and the values schema at work."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from devtools.stack import DEFAULT_PROCESSES
from tests.chart.conftest import (
    CHART,
    CI_VALUES,
    COMPONENT_KEYS,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    by_kind,
    helm,
    render,
    render_error,
)

pytestmark = pytest.mark.chart

COMPONENTS = DEFAULT_PROCESSES  # one Deployment per process of the Procfile
URLS = {"database.url": "postgresql://u:p@db:5432/x", "broker.url": "redis://exports:pw@r:6379/0"}


def test_default_and_production_scenarios_run_every_component() -> None:
    for name in ("default-values.yaml", "production-values.yaml"):
        assert enabled_components(CHART / "ci" / name) == set(COMPONENTS)


def test_there_are_the_scenarios() -> None:
    assert {p.name for p in CI_VALUES} >= {
        "default-values.yaml",
        "kind-values.yaml",
        "production-values.yaml",
        "s3-values.yaml",
    }


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_helm_lint_strict(values: Path) -> None:
    proc = helm(
        "lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, "-f", str(values),
        "--set", "image.tag=0.1.0",
    )  # fmt: skip
    assert "0 chart(s) failed" in proc.stdout, proc.stdout


def enabled_components(values_file: Path) -> set[str]:
    """Kubernetes names of the components a scenario enables (chart default: all)."""
    overrides = (yaml.safe_load(values_file.read_text()) or {}).get("components", {})
    enabled = {k for k in COMPONENT_KEYS if overrides.get(k, {}).get("enabled", True)}
    return {re.sub(r"([A-Z])", lambda m: "-" + m.group(1).lower(), k) for k in enabled}


def test_every_scenario_renders_its_enabled_components(scenario) -> None:
    path, objs = scenario
    names = {d["metadata"]["name"] for d in by_kind(objs, "Deployment")}
    expected = enabled_components(path)
    assert expected <= set(COMPONENTS)
    assert names == {f"{RELEASE}-notes-exports-{c}" for c in expected}
    assert {o["kind"] for o in objs} >= {
        "ConfigMap",
        "Deployment",
        "Service",
        "ServiceAccount",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "Job",
        "Pod",
    }


def test_production_scenario_turns_on_keda_hpa_and_monitoring() -> None:
    objs = render([CHART / "ci" / "production-values.yaml"])
    kinds = {o["kind"] for o in objs}
    assert {"ScaledObject", "HorizontalPodAutoscaler", "ServiceMonitor", "PrometheusRule"} <= kinds
    scaled = {o["spec"]["scaleTargetRef"]["name"] for o in by_kind(objs, "ScaledObject")}
    assert scaled == {
        f"{RELEASE}-notes-exports-fast-worker",
        f"{RELEASE}-notes-exports-bulk-worker",
    }
    dashboards = [
        o for o in by_kind(objs, "ConfigMap") if "grafana_dashboard" in o["metadata"]["labels"]
    ]
    assert dashboards and all(
        o["metadata"]["labels"]["grafana_dashboard"] == "1" for o in dashboards
    )
    for cm in dashboards:
        for text in cm["data"].values():
            board = json.loads(text)
            assert "__RELEASE_PREFIX__" not in text and "__NAMESPACE__" not in text
            assert board["panels"], "a dashboard without panels"
    # Existing secrets only: the chart creates no Secret outside the migration hook.
    assert [s["metadata"]["name"] for s in by_kind(objs, "Secret")] == []


def test_migrations_run_as_a_pre_install_pre_upgrade_hook() -> None:
    objs = render([CHART / "ci" / "default-values.yaml"])
    job = next(o for o in by_kind(objs, "Job"))
    ann = job["metadata"]["annotations"]
    assert ann["helm.sh/hook"] == "pre-install,pre-upgrade"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["exportctl", "migrate"]
    # Everything the hook needs exists before the release's own objects: its own hook SA and
    # Secret, created first (lower weight).
    sa = job["spec"]["template"]["spec"]["serviceAccountName"]
    hook_objs = [o for o in objs if "helm.sh/hook" in o["metadata"].get("annotations", {})]
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in hook_objs}
    assert ("ServiceAccount", sa) in by_name
    secret_ref = container["env"][0]["valueFrom"]["secretKeyRef"]["name"]
    secret = by_name[("Secret", secret_ref)]
    weight = lambda o: int(o["metadata"]["annotations"]["helm.sh/hook-weight"])  # noqa: E731
    assert weight(secret) < weight(job) and weight(by_name[("ServiceAccount", sa)]) < weight(job)


def test_the_migration_job_may_connect_as_the_owner_while_the_processes_do_not() -> None:
    """``migrations.existingSecret``: the Job takes the tables' owner's URLs from it; the
    processes keep ``database.*`` (a member of notes_exports_app, docs/operations.md)."""
    sets = {
        "database.existingSecret": "app-db",
        "database.pooler": "transaction",
        "migrations.existingSecret": "owner-db",
        "migrations.existingSecretKey": "url",
        "migrations.existingSecretDirectKey": "direct",
    }
    objs = render([CHART / "ci" / "default-values.yaml"], sets)
    job = next(o for o in by_kind(objs, "Job"))
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    refs = {k: env[k]["valueFrom"]["secretKeyRef"] for k in ("DATABASE_URL", "DATABASE_DIRECT_URL")}
    assert refs == {
        "DATABASE_URL": {"name": "owner-db", "key": "url"},
        "DATABASE_DIRECT_URL": {"name": "owner-db", "key": "direct"},
    }
    api = next(o for o in by_kind(objs, "Deployment") if o["metadata"]["name"].endswith("-api"))
    api_env = {e["name"]: e for e in api["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert api_env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "app-db"


def test_helm_test_hook_only_calls_readyz() -> None:
    objs = render([CHART / "ci" / "default-values.yaml"])
    pod = next(o for o in by_kind(objs, "Pod"))
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["args"][-1]
    assert f"http://{RELEASE}-notes-exports-api:8000/readyz" in script
    assert "/v1/exports" not in script and "post" not in script.lower()


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ({"components.beat.replicas": "2"}, "/components/beat/replicas"),
        ({"components.beat.strategy.type": "RollingUpdate"}, "Recreate"),
        ({"image.tag": "latest"}, "/image/tag"),
        ({"config.DATABASE_URL": "postgresql://x"}, "DATABASE_URL"),
        ({"config.RATE_LIMIT_REDIS_URL": "redis://:pw@rl:6379/1"}, "RATE_LIMIT_REDIS_URL"),
        ({"securityContext.readOnlyRootFilesystem": "false"}, "readOnlyRootFilesystem"),
        ({"securityContext.allowPrivilegeEscalation": "true"}, "allowPrivilegeEscalation"),
        ({"podSecurityContext.runAsNonRoot": "false"}, "runAsNonRoot"),
        ({"unknownTopLevel": "1"}, "unknownTopLevel"),
        ({"components.api.replicaz": "2"}, "replicaz"),
        ({"components.fastWorker.preStop": "null"}, "preStop"),
    ],
)
def test_schema_rejects_unsafe_or_unknown_values(sets: dict[str, str], message: str) -> None:
    err = render_error(sets={**URLS, **sets})
    assert message in err, err


def test_connection_urls_are_required() -> None:
    err = render_error()
    assert "/database" in err and "/broker" in err


def test_values_yaml_and_every_scenario_validate_against_the_schema_with_jsonschema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    base = yaml.safe_load((CHART / "values.yaml").read_text())
    base["database"]["url"] = URLS["database.url"]
    base["broker"]["url"] = URLS["broker.url"]
    assert list(validator.iter_errors(base)) == []
    for path in CI_VALUES:
        merged = _merge(
            yaml.safe_load((CHART / "values.yaml").read_text()), yaml.safe_load(path.read_text())
        )
        errors = [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(merged)
        ]
        assert errors == [], (path.name, errors)
    beat_twice = _merge(base, {"components": {"beat": {"replicas": 2}}})
    assert any(
        "replicas" in list(map(str, e.absolute_path)) for e in validator.iter_errors(beat_twice)
    )


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_namespace_is_the_release_namespace() -> None:
    objs = render([CHART / "ci" / "production-values.yaml"])
    monitors = by_kind(objs, "ServiceMonitor")
    assert monitors and all(
        m["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE] for m in monitors
    )
