"""The Grafana dashboards of grafana/dashboards/ (the chart ships a copy): structure (schema
version, datasource variable, unique ids, layout, units), and every query parses (promtool)
and reads only metrics and labels of the catalogue."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import grafana
from tests.grafana.support import check_against_catalogue, promtool

pytestmark = pytest.mark.grafana

BOARDS = {
    "exports-backlog": "Exports: backlog and throughput",
    "exports-recovery": "Exports: recovery SLOs",
}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def boards() -> list[tuple[Path, dict[str, Any]]]:
    return list(zip(grafana.dashboard_files(), grafana.load_dashboards(), strict=True))


def test_the_two_dashboards_with_stable_uids() -> None:
    found = {board["uid"]: board["title"] for _, board in boards()}
    assert found == BOARDS
    for path, board in boards():
        assert path.stem == board["uid"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboard_structure(name: str) -> None:
    board = next(b for _, b in boards() if b["uid"] == name)
    assert board["schemaVersion"] >= 39
    assert "id" not in board or board["id"] is None
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"

    panels = grafana.panels(board)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids are not unique"
    queries = [p for p in panels if p["type"] != "row"]
    assert len(queries) >= 8
    for panel in queries:
        title = panel["title"]
        assert panel["datasource"] == DATASOURCE, title
        assert panel.get("description"), title
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{title}: no unit"
        targets = panel["targets"]
        assert targets, f"{title}: no target"
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids)), title
        for target in targets:
            assert target["datasource"] == DATASOURCE, title
            assert target["expr"].strip(), title
            assert target.get("legendFormat"), title

    # the layout: inside the 24-column grid, no two panels overlap
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine


def test_dashboards_show_what_the_design_asks_for() -> None:
    exprs = grafana.dashboard_expressions()
    backlog, recovery = (
        " ".join(expr for title, _, expr in exprs if title == BOARDS[uid])
        for uid in ("exports-backlog", "exports-recovery")
    )
    for metric in [
        'exports_jobs{status="queued"}',
        "exports_oldest_queued_age_seconds",
        "exports_outbox_unpublished",
        "exports_outbox_oldest_age_seconds",
        "exports_submits_total",
        "exports_claims_total",
        "exports_finishes_total",
        "exports_admission_active_jobs",
        "exports_admission_capacity",
        "exports_dispatch_paused_seconds",
        "exports_dispatch_paused_waiting",
        "histogram_quantile(0.5, sum by (queue, le) (rate(exports_pickup_seconds_bucket",
        "histogram_quantile(0.99, sum by (queue, le) (rate(exports_pickup_seconds_bucket",
    ]:
        assert metric in backlog, metric
    for metric in [
        'exports_recovery_seconds_bucket{kind="lease_expiry", le="60.0"}',
        'exports_recovery_seconds_bucket{kind="lost_dispatch", le="90.0"}',
        'histogram_quantile(0.99, sum by (le) (rate(exports_recovery_seconds_bucket{kind="lease_expiry"}',
        'histogram_quantile(0.99, sum by (le) (rate(exports_recovery_seconds_bucket{kind="lost_dispatch"}',
        "exports_retries_total",
        "exports_dead_letters_total",
        "max by (reason) (exports_dead_letters)",
        "exports_expired_leases",
        "exports_scanner_pass_seconds_bucket",
    ]:
        assert metric in recovery, metric


def test_dashboard_queries_parse_and_use_the_catalogue(tmp_path: Path) -> None:
    exprs = grafana.dashboard_expressions()
    assert len(exprs) >= 30
    for board, panel, expr in exprs:
        assert "$" not in expr, f"{board} / {panel}: unresolved variable in {expr}"
        assert check_against_catalogue(expr) == [], f"{board} / {panel}"
        assert not re.search(r"\b(job|instance|component|pod|namespace)\b", expr), panel
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [
                    {"record": f"dashboard:q{i}", "expr": e} for i, (_, _, e) in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = promtool("check", "rules", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_substitution_of_grafana_variables() -> None:
    expr = 'rate(x[$__rate_interval]) + increase(x[${__range}]) + y{a="[[v]]", b="$keep"}'
    assert grafana.substitute(expr, {"v": "1"}) == (
        'rate(x[1m]) + increase(x[1h]) + y{a="1", b="$keep"}'
    )
    assert grafana.substitute("rate(x[$__rate_interval])", {"__rate_interval": "30s"}) == (
        "rate(x[30s])"
    )
