"""Rich tables for the drill results and the soak summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from devtools.drills.evidence import Evidence

_STYLE = {"passed": "green", "failed": "bold red", "skipped": "yellow"}


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def drills_table(results: Sequence[Evidence]) -> Table:
    """One row per drill: verdict, time, jobs, main recovery time, reason."""
    table = Table(title="fault drills", show_lines=False)
    for col in ("drill", "group", "verdict", "s", "jobs", "recovery (s)", "reason"):
        table.add_column(col, overflow="fold")
    for ev in results:
        rec = ", ".join(f"{k}={_fmt(v)}" for k, v in list(ev.recovery_seconds.items())[:2])
        table.add_row(
            ev.name,
            ev.group,
            f"[{_STYLE[ev.verdict]}]{ev.verdict}[/]",
            f"{ev.seconds:.1f}",
            str(len(ev.tracked)),
            rec or "-",
            ev.reason[:160],
        )
    return table


def mapping_table(title: str, rows: dict[str, Any]) -> Table:
    """A two-column table of ``rows``."""
    table = Table(title=title)
    table.add_column("measure")
    table.add_column("value", overflow="fold")
    for k, v in rows.items():
        table.add_row(k, _fmt(v))
    return table


def print_table(table: Table) -> None:
    """Print a table on stdout (wide enough not to truncate)."""
    Console(width=max(120, Console().width)).print(table)
