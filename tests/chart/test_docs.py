"""The chart README is what helm-docs writes from README.md.gotmpl and the ``# --`` comments
of values.yaml (``make chart-docs``), its generated table documents every value, and the
schema types every one."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.stack import ROOT
from tests.chart.conftest import CHART

pytestmark = pytest.mark.chart

README = (CHART / "README.md").read_text()
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
HELM_DOCS = Path(os.environ.get("HELM_DOCS", ROOT / ".tools" / "bin" / "helm-docs"))
# Values whose content is a Kubernetes object or a free map: documented as one value.
OBJECT_VALUES = {
    "resources", "probes", "preStop", "strategy", "podSecurityContext", "securityContext",
    "env", "config", "affinity", "nodeSelector", "tolerations", "topologySpreadConstraints",
    "podAnnotations", "podLabels", "annotations", "labels", "commonLabels", "imagePullSecrets",
    "ingressFrom", "metricsFrom", "to", "extra", "additionalRules", "args", "accessModes", "ports",
}  # fmt: skip
# A row of the generated values table: | `key` | type | default | description |
ROW = re.compile(r"^\| `([^`]+)` \| ([a-z]+) \| (.*) \| (.*) \|$", re.M)


def helm_docs_flags() -> list[str]:
    """The flags `make chart-docs` passes (HELM_DOCS_FLAGS of the Makefile), with the chart."""
    makefile = (ROOT / "Makefile").read_text()
    line = re.search(r"^HELM_DOCS_FLAGS\s*:?=\s*(.*)$", makefile, re.M)
    assert line, "HELM_DOCS_FLAGS is gone from the Makefile"
    return line.group(1).replace("$(CHART)", str(CHART)).split()


def test_the_readme_is_what_helm_docs_writes() -> None:
    """README.md is generated: a value, a comment or README.md.gotmpl changed without
    `make chart-docs` (or README.md edited by hand) fails here."""
    if not HELM_DOCS.is_file():
        pytest.fail(f"{HELM_DOCS} is missing: run `make helm-docs` (go install, pinned)")
    proc = subprocess.run(
        [str(HELM_DOCS), *helm_docs_flags(), "--dry-run", "--log-level", "warning"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    # helm-docs reports a template error as a warning and still exits 0
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == README, "charts/notes-exports/README.md is stale: run `make chart-docs`"


def rows() -> dict[str, tuple[str, str, str]]:
    """key -> (type, default, description) of the generated values table."""
    found = {m[1]: (m[2], m[3], m[4]) for m in ROW.finditer(README.split("\n## Values\n", 1)[1])}
    assert len(found) > 100
    return found


def leaves(node: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and key not in OBJECT_VALUES:
            yield from leaves(value, path)
        else:
            yield path


def documented(path: str, table: dict[str, tuple[str, str, str]]) -> bool:
    """A value has its own row; a component's key may instead be documented once for every
    component: on another component (the same key: components.api.args documents the
    publisher's args) or as the default it overrides (defaults.<key>)."""
    if path in table:
        return True
    m = re.fullmatch(r"components\.[A-Za-z]+\.(.+)", path)
    if not m:
        return False
    rest = m.group(1)
    return f"defaults.{rest}" in table or any(
        re.fullmatch(rf"components\.[A-Za-z]+\.{re.escape(rest)}", k) for k in table
    )


def test_every_value_has_a_row_with_a_description() -> None:
    table = rows()
    paths = list(leaves(VALUES))
    assert len(paths) > 100
    assert [p for p in paths if not documented(p, table)] == []
    for name in VALUES["components"]:
        assert f"components.{name}" in table, name
    assert [k for k, (_, _, description) in table.items() if not description.strip()] == []
    # the extension points: in defaults, for every component
    for key in (
        "extraEnv", "extraEnvFrom", "extraVolumes", "extraVolumeMounts", "initContainers",
        "sidecars",
    ):  # fmt: skip
        assert f"defaults.{key}" in table, key
    assert "extraObjects" in table


def test_the_documentation_check_catches_an_undocumented_value() -> None:
    table = rows()
    assert not documented("components.api.noSuchKey", table)
    assert not documented("image.noSuchKey", table)
    assert documented("components.bulkWorker.keda.queue", table)  # fastWorker's row
    assert documented("components.publisher.sidecars", table)  # defaults.sidecars


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    target: dict[str, Any] = SCHEMA
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return target


def _child(node: dict[str, Any], part: str) -> dict[str, Any] | None:
    """The schema of property ``part`` of ``node``: its own properties, else those of a
    ``$ref`` or of an ``allOf`` member (a component is its $ref plus requirements)."""
    node = _resolve(node)
    found = node.get("properties", {}).get(part)
    if found is not None:
        return found
    for sub in node.get("allOf", []):
        found = _child(sub, part)
        if found is not None:
            return found
    return None


def schema_for(path: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = SCHEMA
    for part in path.split("."):
        if node is None:
            return None
        node = _child(node, part)
    return node


def test_every_value_is_typed_by_the_schema() -> None:
    untyped = [p for p in leaves(VALUES) if schema_for(p) is None]
    assert untyped == []
