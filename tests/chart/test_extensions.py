"""The chart's extension points (README "Extending the pods"): extraObjects and, in
``defaults`` and per component, extraEnv, extraEnvFrom, extraVolumes, extraVolumeMounts,
initContainers and sidecars, rendered from ci/extensions-values.yaml and checked where they
land and where they must not; then the renders the chart refuses."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.stack import DEFAULT_PROCESSES
from tests.chart.conftest import CHART, RELEASE, by_kind, find, pod_specs, render, render_error

pytestmark = pytest.mark.chart

SCENARIO = CHART / "ci" / "extensions-values.yaml"
PREFIX = f"{RELEASE}-notes-exports"
COMPONENTS = DEFAULT_PROCESSES  # one Deployment per process of the Procfile
URLS = {
    "database": {"url": "postgresql://u:p@db:5432/x"},
    "broker": {"url": "redis://exports:pw@r:6379/0"},
}


@pytest.fixture(scope="module")
def objs() -> list[dict[str, Any]]:
    return render([SCENARIO])


@pytest.fixture(scope="module")
def plain() -> list[dict[str, Any]]:
    """The same chart without the extension points (ci/default-values.yaml)."""
    return render([CHART / "ci" / "default-values.yaml"])


def pod(objs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    return find(objs, "Deployment", f"{PREFIX}-{component}")["spec"]["template"]["spec"]


def main(spec: dict[str, Any], component: str) -> dict[str, Any]:
    (c,) = [c for c in spec["containers"] if c["name"] == component]
    return c


def env(container: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(e["name"], e.get("value", e.get("valueFrom"))) for e in container.get("env", [])]


def values_file(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({**URLS, **values}))
    return path


def test_extra_objects_render_through_tpl_with_the_release_labels(objs, plain) -> None:
    names = {o["metadata"]["name"] for o in by_kind(objs, "ConfigMap")}
    extra = {f"{RELEASE}-ca-bundle", f"{RELEASE}-site", f"{RELEASE}-log-shipper"}
    assert extra <= names
    # the string item too: its {{ include }} and {{ .Release.Name }} are rendered
    shipper = find(objs, "ConfigMap", f"{RELEASE}-log-shipper")
    assert "Name tail" in shipper["data"]["shipper.conf"]
    for name in extra:
        labels = find(objs, "ConfigMap", name)["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
    assert not extra & {o["metadata"]["name"] for o in by_kind(plain, "ConfigMap")}


def test_default_env_reaches_every_component_and_a_component_replaces_by_name(objs) -> None:
    for component in COMPONENTS:
        items = env(main(pod(objs, component), component))
        names = [n for n, _ in items]
        # after the chart's own variables and `env` (HEARTBEAT_FILE comes from defaults.env)
        assert names.index("SITE") > names.index("HEARTBEAT_FILE"), component
        assert ("NODE_NAME", {"fieldRef": {"fieldPath": "spec.nodeName"}}) in items
        assert ("RELEASE_NAME", RELEASE) in items, component
        site = [v for n, v in items if n == "SITE"]
        # bulk-worker's own SITE replaced the default's in its place; EXTRA_BULK is its alone
        assert site == (["eu-central"] if component == "bulk-worker" else ["eu-west"])
        assert ("EXTRA_BULK" in names) == (component == "bulk-worker"), component
        if component == "bulk-worker":
            assert names.index("SITE") < names.index("NODE_NAME") < names.index("EXTRA_BULK")


def test_env_from_sources_follow_the_charts_own(objs) -> None:
    for component in COMPONENTS:
        sources = main(pod(objs, component), component)["envFrom"]
        assert sources[0] == {"configMapRef": {"name": PREFIX}}, component
        assert {"configMapRef": {"name": f"{RELEASE}-site"}, "prefix": "SITE_"} in sources
        secret = {"secretRef": {"name": "api-extra-env", "optional": True}}
        assert (secret in sources) == (component == "api"), component
        assert sources[-1] == (secret if component == "api" else sources[-1])


def test_sidecar_only_beside_the_api_hardened_by_default(objs, plain) -> None:
    for component in COMPONENTS:
        names = [c["name"] for c in pod(objs, component)["containers"]]
        # the component's own container first, the sidecar after it
        assert names == ([component, "log-shipper"] if component == "api" else [component])
    shipper = pod(objs, "api")["containers"][1]
    assert shipper["image"] == "docker.io/fluent/fluent-bit:3.2.4"
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    # no securityContext of its own: the chart's, so the pod stays restricted
    assert shipper["securityContext"] == chart_values["securityContext"]
    assert shipper["volumeMounts"] == [
        {"name": "shipper-config", "mountPath": "/fluent-bit/etc", "readOnly": True}
    ]
    assert [c["name"] for c in pod(plain, "api")["containers"]] == ["api"]


def test_init_container_only_in_the_fast_worker(objs) -> None:
    for component in COMPONENTS:
        inits = [c["name"] for c in pod(objs, component).get("initContainers", [])]
        assert inits == (["wait-for-ca"] if component == "fast-worker" else []), component
    (init,) = pod(objs, "fast-worker")["initContainers"]
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_extra_volumes_and_mounts(objs) -> None:
    for component in COMPONENTS:
        spec = pod(objs, component)
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["ca-bundle"] == {
            "name": "ca-bundle",
            "configMap": {"name": f"{RELEASE}-ca-bundle"},
        }
        assert ("shipper-config" in volumes) == (component == "api"), component
        # the chart's own volumes are still there, the extra ones after them
        assert list(volumes)[:2] == ["tmp", "run"]
        mounts = [m for m in main(spec, component)["volumeMounts"] if m["name"] == "ca-bundle"]
        # bulk-worker's mount with the same mountPath replaced the default one
        read_only = component != "bulk-worker"
        assert mounts == [
            {"name": "ca-bundle", "mountPath": "/etc/ssl/company", "readOnly": read_only}
        ], component
        # the main container mounts neither the sidecar's volume nor anything twice
        paths = [m["mountPath"] for m in main(spec, component)["volumeMounts"]]
        assert len(paths) == len(set(paths)) and "/fluent-bit/etc" not in paths


def test_the_hook_job_and_the_test_pod_get_none_of_it(objs) -> None:
    for obj, spec in pod_specs(objs):
        if obj["kind"] == "Deployment":
            continue
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert "initContainers" not in spec, where
        assert len(spec["containers"]) == 1, where
        assert "ca-bundle" not in {v["name"] for v in spec.get("volumes", [])}, where
        assert "SITE" not in {e["name"] for e in spec["containers"][0].get("env", [])}, where


def test_the_defaults_render_no_extension(plain) -> None:
    for component in COMPONENTS:
        spec = pod(plain, component)
        assert "initContainers" not in spec and len(spec["containers"]) == 1
        names = {e["name"] for e in main(spec, component)["env"]}
        assert not names & {"SITE", "NODE_NAME", "RELEASE_NAME"}
    assert "extra-objects" not in str(plain)


def test_a_container_keeps_its_own_security_context(tmp_path: Path) -> None:
    own = {"runAsNonRoot": True, "runAsUser": 65532, "readOnlyRootFilesystem": True}
    sidecar = {"name": "proxy", "image": "proxy:1.0", "securityContext": own}
    objs = render([values_file(tmp_path, {"components": {"publisher": {"sidecars": [sidecar]}}})])
    (proxy,) = [c for c in pod(objs, "publisher")["containers"] if c["name"] == "proxy"]
    assert proxy["securityContext"] == own


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"components": {"api": {"extraEnv": [{"name": "API_WORKERS", "value": "4"}]}}},
            "components.api: API_WORKERS is set in env and in extraEnv",
        ),
        (
            {"defaults": {"sidecars": [{"name": "beat", "image": "x:1"}]}},
            'components.beat: a sidecar or init container may not be named "beat"',
        ),
        (
            {"extraObjects": ["just a string"]},
            "extraObjects[0] is not one Kubernetes object",
        ),
    ],
    ids=["env-twice", "container-name-taken", "not-an-object"],
)
def test_the_template_refuses_clashes(tmp_path: Path, values: dict[str, Any], message) -> None:
    assert message in render_error([values_file(tmp_path, values)])


@pytest.mark.parametrize(
    "values",
    [
        # a connection URL or a credential comes from the chart's Secrets, never from here
        {"defaults": {"extraEnv": [{"name": "DATABASE_URL", "value": "postgresql://x"}]}},
        {"components": {"api": {"extraEnv": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "k"}]}}},
        {"defaults": {"extraEnv": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {}}}]}},
        # the chart's own volume names are taken
        {"defaults": {"extraVolumes": [{"name": "tmp", "emptyDir": {}}]}},
        {"components": {"api": {"extraVolumes": [{"name": "artifacts", "emptyDir": {}}]}}},
        {"defaults": {"extraVolumeMounts": [{"name": "x", "mountPath": "relative"}]}},
        {"defaults": {"extraEnvFrom": [{"prefix": "X_"}]}},
        {"components": {"api": {"sidecars": [{"name": "no-image"}]}}},
        {"components": {"api": {"initContainers": [{"name": "Bad_Name", "image": "x:1"}]}}},
        {"extraObjects": [{"kind": "ConfigMap", "metadata": {"name": "x"}}]},
        {"defaults": {"sidecars": {"name": "not-a-list", "image": "x:1"}}},
    ],
    ids=[
        "database-url",
        "aws-secret",
        "value-and-valueFrom",
        "volume-tmp",
        "volume-artifacts",
        "relative-mount",
        "envFrom-without-source",
        "sidecar-without-image",
        "bad-container-name",
        "object-without-apiVersion",
        "not-a-list",
    ],
)
def test_the_schema_refuses(tmp_path: Path, values: dict[str, Any]) -> None:
    assert "values don't meet the specifications of the schema" in render_error(
        [values_file(tmp_path, values)]
    )


def test_the_readme_example_renders_as_it_says(tmp_path: Path) -> None:
    """The YAML of the README's "Extending the pods" is valid values and does what the text
    around it says."""
    readme = (CHART / "README.md").read_text()
    section = readme.split("## Extending the pods", 1)[1].split("\n## ", 1)[0]
    (example,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    objs = render([values_file(tmp_path, yaml.safe_load(example))])
    assert find(objs, "ConfigMap", f"{RELEASE}-ca-bundle")["data"] == {"ca.crt": "..."}
    for component in COMPONENTS:
        spec = pod(objs, component)
        c = main(spec, component)
        assert ("SSL_CERT_DIR", "/etc/ssl/company") in env(c)
        assert {"name": "ca-bundle", "mountPath": "/etc/ssl/company", "readOnly": True} in c[
            "volumeMounts"
        ]
        sidecars = [x["name"] for x in spec["containers"] if x["name"] != component]
        assert sidecars == (["log-shipper"] if component == "api" else [])
