"""The Grafana dashboards and Prometheus rules, as data.

The dashboards' source is the repository's ``grafana/dashboards/``, next to the provisioning
files a standalone Grafana reads (``grafana/provisioning/``, grafana/README.md). Helm reads no
file outside the chart, so the chart ships a copy of them in
``charts/notes-exports/files/dashboards/``: :func:`sync_chart_dashboards` (``make dashboards``)
writes it, and ``tests/chart/test_grafana.py`` fails while it differs from the source. The
Prometheus rules live once, in the chart's ``files/alerts/``; ``tests/grafana/rules/`` holds
their promtool unit tests.

- :func:`dashboard_expressions` — ``(dashboard title, panel title, expr)`` for every query of
  every dashboard, with Grafana's variables (``$__rate_interval``, ``$__range``,
  ``${datasource}``, ...) replaced by concrete values, ready for a real Prometheus.
- :func:`rule_expressions` — ``(alert or record name, expr)`` for every rule; with
  ``inline_records=True`` the recording rules an expression reads are inlined, so it can run
  as an ad-hoc query on a Prometheus that has not loaded the rules.

``python -m devtools.grafana`` prints every expression (tab separated); ``python -m
devtools.grafana sync`` copies the dashboards into the chart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
"""The dashboards' one source (what a standalone Grafana's provisioning reads)."""
PROVISIONING = GRAFANA / "provisioning"
CHART_FILES = ROOT / "charts" / "notes-exports" / "files"
CHART_DASHBOARDS = CHART_FILES / "dashboards"
"""The chart's copy of :data:`DASHBOARDS` (written by :func:`sync_chart_dashboards`)."""
ALERTS = CHART_FILES / "alerts"
RULE_TESTS = ROOT / "tests" / "grafana" / "rules"

# Concrete values for Grafana's variables. `$__rate_interval` must cover at least four scrape
# intervals of the Prometheus that runs the expression (one minute does for scrapes up to 15 s).
DEFAULT_VARIABLES: Mapping[str, str] = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
    "__range_s": "3600",
    "datasource": "prometheus",
}

_VARIABLE = re.compile(r"\$\{(\w+)(?::[\w-]+)?\}|\[\[(\w+)\]\]|\$(\w+)")


def substitute(expr: str, variables: Mapping[str, str] | None = None) -> str:
    """``expr`` with Grafana variables replaced (``DEFAULT_VARIABLES`` updated by
    ``variables``); unknown variables are left as they are."""
    values = {**DEFAULT_VARIABLES, **(variables or {})}

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return values.get(name, m.group(0))

    return _VARIABLE.sub(repl, expr)


def dashboard_files() -> list[Path]:
    """The dashboards of :data:`DASHBOARDS` (the source), sorted by name."""
    return sorted(DASHBOARDS.glob("*.json"))


def chart_dashboard_differences() -> list[str]:
    """How the chart's copy (:data:`CHART_DASHBOARDS`) differs from the source, one line per
    file: missing from the chart, only in the chart, or not byte-identical. Empty when they
    are the same files."""
    source = {p.name: p.read_bytes() for p in dashboard_files()}
    copy = {p.name: p.read_bytes() for p in sorted(CHART_DASHBOARDS.glob("*.json"))}
    problems = [f"{name}: missing from the chart" for name in sorted(source.keys() - copy.keys())]
    problems += [f"{name}: only in the chart" for name in sorted(copy.keys() - source.keys())]
    problems += [
        f"{name}: differs from grafana/dashboards/{name}"
        for name in sorted(source.keys() & copy.keys())
        if source[name] != copy[name]
    ]
    return problems


def sync_chart_dashboards() -> list[str]:
    """Make the chart's copy the source's: write every dashboard of :data:`DASHBOARDS` into
    :data:`CHART_DASHBOARDS` and remove the chart's ``*.json`` the source no longer has.
    Returns what it changed (:func:`chart_dashboard_differences` before the sync)."""
    changed = chart_dashboard_differences()
    CHART_DASHBOARDS.mkdir(parents=True, exist_ok=True)
    names: set[str] = set()
    for path in dashboard_files():
        names.add(path.name)
        target = CHART_DASHBOARDS / path.name
        if not target.exists() or target.read_bytes() != path.read_bytes():
            target.write_bytes(path.read_bytes())
    for stale in CHART_DASHBOARDS.glob("*.json"):
        if stale.name not in names:
            stale.unlink()
    return changed


def rule_files() -> list[Path]:
    return sorted(ALERTS.glob("*.yaml"))


def rule_test_files() -> list[Path]:
    return sorted(RULE_TESTS.glob("*.yaml"))


def load_dashboards() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in dashboard_files()]


def panels(board: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every panel of a dashboard, those nested in collapsed rows included."""
    out: list[dict[str, Any]] = []
    for panel in board.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_expressions(
    variables: Mapping[str, str] | None = None,
) -> list[tuple[str, str, str]]:
    """``(dashboard title, panel title, expr)`` of every query, variables substituted."""
    out = []
    for board in load_dashboards():
        for panel in panels(board):
            for target in panel.get("targets", []):
                expr = target.get("expr", "")
                if expr:
                    out.append((board["title"], panel["title"], substitute(expr, variables)))
    return out


def load_rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for path in rule_files():
        groups.extend(yaml.safe_load(path.read_text())["groups"])
    return groups


def rules() -> list[dict[str, Any]]:
    return [rule for group in load_rule_groups() for rule in group["rules"]]


def alert_names() -> list[str]:
    return [r["alert"] for r in rules() if "alert" in r]


def rule_expressions(*, inline_records: bool = False) -> list[tuple[str, str]]:
    """``(alert or record name, expr)`` of every rule, in file order.

    With ``inline_records`` every reference to a recording rule of these files is replaced by
    the parenthesised expression that records it."""
    all_rules = rules()
    out = [(r.get("alert") or r["record"], r["expr"].strip()) for r in all_rules]
    if not inline_records:
        return out
    records = {r["record"]: r["expr"].strip() for r in all_rules if "record" in r}
    names = sorted(records, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w:])(" + "|".join(map(re.escape, names)) + r")(?![\w:])")

    def inline(expr: str) -> str:
        for _ in range(10):  # records may read records
            new = pattern.sub(lambda m: f"({records[m.group(1)]})", expr)
            if new == expr:
                break
            expr = new
        return expr

    return [(name, inline(expr) if names else expr) for name, expr in out]


def main(argv: list[str]) -> int:
    """``python -m devtools.grafana [sync]``: print every expression, or sync the chart's
    copy of the dashboards."""
    if argv[:1] == ["sync"]:
        for line in sync_chart_dashboards() or ["the chart's dashboards are up to date"]:
            print(line)
        return 0
    for board, panel, expr in dashboard_expressions():
        print(f"{board}\t{panel}\t{' '.join(expr.split())}")
    for name, expr in rule_expressions():
        print(f"rule\t{name}\t{' '.join(expr.split())}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
