"""The provisioning files of grafana/ that a standalone Grafana reads: a file provider for the
dashboards of grafana/dashboards/ at the path grafana/README.md mounts them, in the chart's
folder, and a default Prometheus data source for the dashboards' ``datasource`` variable
(Grafana's provisioning format: apiVersion 1, ``providers`` / ``datasources``)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from devtools import grafana

pytestmark = pytest.mark.grafana


def _load(kind: str) -> list[dict[str, Any]]:
    files = sorted((grafana.PROVISIONING / kind).glob("*.yaml"))
    assert files, f"grafana/provisioning/{kind}/ holds no file"
    docs = [yaml.safe_load(f.read_text()) for f in files]
    for doc in docs:
        assert doc["apiVersion"] == 1
    return docs


def _readme_mounts() -> dict[str, str]:
    """``container path -> repository path`` of the ``-v`` options in grafana/README.md."""
    text = (grafana.GRAFANA / "README.md").read_text()
    return {
        inside: outside
        for outside, inside in re.findall(r'-v "\$PWD/([^:"]+):([^:"]+)(?::ro)?"', text)
    }


def test_the_dashboards_live_in_grafana_dashboards() -> None:
    assert grafana.DASHBOARDS == grafana.ROOT / "grafana" / "dashboards"
    assert {p.name for p in grafana.dashboard_files()} == {
        "exports-backlog.json",
        "exports-recovery.json",
    }


def test_a_file_provider_loads_the_dashboards_where_the_readme_mounts_them() -> None:
    (doc,) = _load("dashboards")
    (provider,) = doc["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    mounts = _readme_mounts()
    assert mounts.get(path) == "grafana/dashboards", mounts
    assert mounts.get("/etc/grafana/provisioning") == "grafana/provisioning", mounts
    # the folder the chart's ConfigMaps name, so both installs look alike
    values = yaml.safe_load((grafana.ROOT / "charts/notes-exports/values.yaml").read_text())
    assert provider["folder"] == values["dashboards"]["folder"]


def test_a_default_prometheus_data_source_for_the_datasource_variable() -> None:
    (doc,) = _load("datasources")
    (source,) = doc["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"] == "${PROMETHEUS_URL}"
    assert "PROMETHEUS_URL=" in (grafana.GRAFANA / "README.md").read_text()
    for board in grafana.load_dashboards():
        (variable,) = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
        assert variable["query"] == source["type"], board["uid"]
