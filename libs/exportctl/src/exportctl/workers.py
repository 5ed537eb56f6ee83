"""``exportctl workers list``: the Celery workers through the admin API (an operator key of
any role; docs/operations.md, "Workers")."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from exportctl.api import DEFAULT_API_URL, ApiUrl, OperatorKey, call, need_operator_key
from exportctl.common import app, err, when
from exportctl.output import AsJson, OutputOpt, emit_rows, mode
from exportctl.tables import Col, fit

workers_app = typer.Typer(
    help="The Celery workers: host, queues, jobs in hand, last heartbeat (operator key).",
    no_args_is_help=True,
)
app.add_typer(workers_app, name="workers")


def workers_table(rows: list[dict[str, Any]]) -> Table:
    """Workers (``/v1/admin/workers`` items), fitted to the terminal."""

    def heartbeat(r: dict[str, Any]) -> str:
        if not r["answered"]:
            return "did not answer"
        if r["heartbeat_at"]:
            return f"{when(r['heartbeat_at'])} ({r['heartbeat_age_seconds']:g} s ago)"
        return "no liveness file" if not r["liveness_file"] else "none yet"

    return fit(
        [
            Col("worker", lambda r: r["name"], fold=True),
            Col("queues", lambda r: ",".join(r["queues"]), priority=1),
            Col("in hand", lambda r: r["jobs_in_hand"] if r["answered"] else "", justify="right"),
            Col("heartbeat (UTC)", heartbeat, fold=True),
            Col("host", lambda r: r["host"], priority=2),
        ],
        rows,
    )


@workers_app.command("list")
def list_(
    timeout: Annotated[
        float, typer.Option(min=0.1, max=5.0, help="seconds to wait for the workers' answers")
    ] = 1.0,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Every worker the broker knows or that answered (``GET /v1/admin/workers``). When the
    broker could not be read in time, says so on stderr and lists what was known."""
    need_operator_key(api_key)
    report = call(api_url, api_key, "GET", f"/v1/admin/workers?timeout={timeout:g}")
    if report.get("error"):
        err.print(f"warning: {report['error']}")
    emit_rows(report["workers"], mode(output, as_json), workers_table, empty="no workers")
