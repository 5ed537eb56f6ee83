"""Rendering the Helm chart with the pinned helm (``make helm``) for the chart tests."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.stack import ROOT

CHART = ROOT / "charts" / "notes-exports"
CI_VALUES = sorted(CHART.glob("ci/*-values.yaml"))
HELM = Path(os.environ.get("HELM", ROOT / ".tools" / "bin" / "helm"))
NPM_MODULES = Path(os.environ.get("CRD_SCHEMA_MODULES", ROOT / ".tools" / "npm" / "node_modules"))
# helm built with `go install` defaults to Kubernetes 1.20 for rendering; the chart needs 1.29+.
KUBE_VERSION = "1.29.0"
RELEASE = "rel"
# What a user must pass at install: the tag of the image they built and loaded (no image is
# published, so the chart has no default tag; see test_render's test of the message).
USER_SETS: dict[str, str] = {"image.tag": "0.1.0"}
NAMESPACE = "exports"
# The chart's components, by their key in values.yaml `components` (one per process of the
# Procfile; the Kubernetes name is the key in kebab case: recoveryScanner -> recovery-scanner).
COMPONENT_KEYS = (
    "api",
    "publisher",
    "recoveryScanner",
    "beat",
    "fastWorker",
    "bulkWorker",
    "webhookDelivery",
)

pytestmark = pytest.mark.chart


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the project's pinned helm; fails the test (never skips) when it is missing."""
    if not HELM.is_file():
        pytest.fail(f"{HELM} is missing: run `make helm` (go install of the pinned helm)")
    proc = subprocess.run([str(HELM), *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def render(
    values_files: Iterable[Path] = (),
    sets: Mapping[str, str] | None = None,
    *,
    check: bool = True,
) -> list[dict[str, Any]]:
    """``helm template`` the chart; returns the rendered objects (hooks and tests included)."""
    args = [
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
    ]
    for f in values_files:
        args += ["-f", str(f)]
    for k, v in {**USER_SETS, **(sets or {})}.items():
        args += ["--set-string" if isinstance(v, str) else "--set", f"{k}={v}"]
    proc = helm(*args, check=check)
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def render_error(
    values_files: Iterable[Path] = (),
    sets: Mapping[str, str] | None = None,
    *,
    kube_version: str = KUBE_VERSION,
) -> str:
    """The error helm prints when rendering must fail (for ``kube_version``)."""
    args = ["template", RELEASE, str(CHART), "--kube-version", kube_version]
    for f in values_files:
        args += ["-f", str(f)]
    for k, v in {**USER_SETS, **(sets or {})}.items():
        args += ["--set", f"{k}={v}"]
    proc = helm(*args, check=False)
    assert proc.returncode != 0, "rendering succeeded but must fail"
    return proc.stderr


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for o in objs:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    raise AssertionError(
        f"no {kind} {name} in {[(o['kind'], o['metadata']['name']) for o in objs]}"
    )


def pod_specs(objs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(object, pod spec) for every object that runs pods."""
    out = []
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet", "Job"):
            out.append((o, o["spec"]["template"]["spec"]))
        elif o["kind"] == "Pod":
            out.append((o, o["spec"]))
    return out


@pytest.fixture(scope="session", params=CI_VALUES, ids=[p.name for p in CI_VALUES])
def scenario(request: pytest.FixtureRequest) -> tuple[Path, list[dict[str, Any]]]:
    """Each ci/*-values.yaml with its rendered objects."""
    path: Path = request.param
    return path, render([path])


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())
