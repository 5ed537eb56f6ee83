"""The Grafana dashboards and Prometheus rules, as data.

They exist once, in the Helm chart (``charts/notes-exports/files/dashboards/`` and
``files/alerts/``: Helm reads no file outside the chart); a plain Grafana or Prometheus loads
the same files, and ``tests/grafana/rules/`` holds the promtool unit tests of the rules.

- :func:`dashboard_expressions` — ``(dashboard title, panel title, expr)`` for every query of
  every dashboard, with Grafana's variables (``$__rate_interval``, ``$__range``,
  ``${datasource}``, ...) replaced by concrete values, ready for a real Prometheus.
- :func:`rule_expressions` — ``(alert or record name, expr)`` for every rule; with
  ``inline_records=True`` the recording rules an expression reads are inlined, so it can run
  as an ad-hoc query on a Prometheus that has not loaded the rules.

``python -m devtools.grafana`` prints every expression (tab separated).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART_FILES = ROOT / "charts" / "notes-exports" / "files"
DASHBOARDS = CHART_FILES / "dashboards"
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
    return sorted(DASHBOARDS.glob("*.json"))


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
