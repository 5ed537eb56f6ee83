"""The chart README lists every value of values.yaml, and the schema types every one."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.chart.conftest import CHART

pytestmark = pytest.mark.chart

README = (CHART / "README.md").read_text()
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
# Values whose content is a Kubernetes object or a free map: documented as one value.
OBJECT_VALUES = {
    "resources", "probes", "preStop", "strategy", "podSecurityContext", "securityContext",
    "env", "config", "affinity", "nodeSelector", "tolerations", "topologySpreadConstraints",
    "podAnnotations", "podLabels", "annotations", "labels", "commonLabels", "imagePullSecrets",
    "ingressFrom", "metricsFrom", "to", "extra", "additionalRules", "args", "accessModes", "ports",
}  # fmt: skip


def leaves(node: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and key not in OBJECT_VALUES:
            yield from leaves(value, path)
        else:
            yield path


def documented_as(path: str) -> str:
    return re.sub(r"^components\.[A-Za-z]+\.", "components.<name>.", path)


def test_every_value_is_documented_in_the_chart_readme() -> None:
    paths = list(leaves(VALUES))
    assert len(paths) > 100
    missing = sorted({documented_as(p) for p in paths if f"`{documented_as(p)}`" not in README})
    assert missing == []
    for name in VALUES["components"]:
        assert f"`components.{name}`" in README


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
