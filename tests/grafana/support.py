"""Shared by the dashboard and rule tests: promtool, and the metric catalogue of exportcore.metrics."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from exportcore import metrics

HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
RECORD_PREFIX = "exports:"


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run promtool (Debian package prometheus); fails, never skips, when it is missing."""
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail(
            "promtool is missing: `make promtool` (bash scripts/localstack.sh os-packages "
            "prometheus); `make test` installs it"
        )
    return subprocess.run([tool, *map(str, args)], capture_output=True, text=True, check=False)


def catalogue() -> dict[str, tuple[str, set[str]]]:
    """``name -> (type, labels)`` from the table in exportcore.metrics' docstring."""
    out: dict[str, tuple[str, set[str]]] = {}
    for line in (metrics.__doc__ or "").splitlines():
        m = re.match(r"^(exports_\w+)\s+(counter|histogram|gauge)\s+(.*)$", line)
        if m:
            column = m.group(3).split(" (")[0]
            labels = {part.strip() for part in column.split(",")} - {"—", ""}
            out[m.group(1)] = (m.group(2), labels)
    assert len(out) >= 20, "the catalogue table of exportcore.metrics was not found"
    return out


def metric_of(series_name: str, known: dict[str, tuple[str, set[str]]]) -> str | None:
    """The catalogue metric a series name belongs to (histogram suffixes stripped)."""
    if series_name in known:
        return series_name
    for suffix in HISTOGRAM_SUFFIXES:
        base = series_name.removesuffix(suffix)
        if base != series_name and known.get(base, ("", set()))[0] == "histogram":
            return base
    return None


def grouping_labels(expr: str) -> set[str]:
    """Labels named in the ``by (...)`` / ``without (...)`` clauses of ``expr``."""
    return {
        label
        for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
        for label in re.findall(r"\w+", clause)
    }


def check_against_catalogue(expr: str, records: Mapping[str, set[str]] | None = None) -> list[str]:
    """Problems of ``expr``: unknown metric names, labels a metric does not have (in
    selectors and ``by``/``without`` clauses), histogram bounds that are not buckets.
    ``records`` maps recording rule names to their labels."""
    records = records or {}
    known = catalogue()
    problems: list[str] = []
    used_labels: set[str] = {"le"}
    for name in re.findall(r"(?<![\w:])(exports_\w+|exports:[\w:]+)", expr):
        if name in records:
            used_labels |= records[name]
            continue
        metric = metric_of(name, known)
        if metric is None:
            problems.append(f"unknown metric {name}")
            continue
        used_labels |= known[metric][1]
    for name, body in re.findall(r"(exports_\w+)\s*\{([^}]*)\}", expr):
        metric = metric_of(name, known)
        if metric is None:
            continue
        allowed = known[metric][1] | ({"le"} if name.endswith("_bucket") else set())
        for label, value in re.findall(r"(\w+)\s*(?:=~|!=|!~|=)\s*\"([^\"]*)\"", body):
            if label not in allowed:
                problems.append(f"{name} has no label {label}")
            if label == "le":
                buckets = {
                    "exports_recovery_seconds": metrics.RECOVERY_BUCKETS,
                    "exports_pickup_seconds": metrics.FAST_BUCKETS,
                    "exports_scanner_pass_seconds": metrics.FAST_BUCKETS,
                }.get(metric, metrics.RUN_BUCKETS)
                if float(value) not in buckets or value != repr(float(value)):
                    problems.append(f"{name}: le={value!r} is not a bucket bound as exposed")
    for label in sorted(grouping_labels(expr) - used_labels):
        problems.append(f"grouping by {label}, which no metric of the expression has")
    return problems
