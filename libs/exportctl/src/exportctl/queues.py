"""``exportctl queue status | pause | resume``: dispatch of a queue, or of one tenant on a
queue, through the admin API with an operator key (docs/operations.md, "Pausing dispatch").

``status`` takes any operator key; ``pause`` and ``resume`` an ``admin`` one, and a reason,
which the audit trail keeps with who asked and when.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from exportcore.domain import QUEUES
from exportctl.api import DEFAULT_API_URL, ApiUrl, OperatorKey, call, need_operator_key
from exportctl.common import app, completes, err, fail, safe, when
from exportctl.exits import EXIT_USAGE
from exportctl.output import AsJson, OutputOpt, emit_object, emit_rows, explicit, mode
from exportctl.tables import Col, fit

queue_app = typer.Typer(
    help="Pause and resume dispatch of a queue, or of one tenant on it (operator key).",
    no_args_is_help=True,
)
app.add_typer(queue_app, name="queue")

Queue = Annotated[
    str,
    typer.Argument(help=f"the queue: {' | '.join(QUEUES)}", autocompletion=completes(*QUEUES)),
]
Reason = Annotated[str, typer.Option(help="why (required; kept in the audit trail)")]
Tenant = Annotated[
    str | None, typer.Option(help="only this tenant's dispatch on the queue (default: all)")
]


def _check(queue: str, reason: str) -> None:
    if queue not in QUEUES:
        raise fail(f"the queue is one of {', '.join(QUEUES)}, not {queue!r}", EXIT_USAGE)
    if not reason.strip():
        raise fail(
            "give --reason: why dispatch is paused or resumed (the audit keeps it)", EXIT_USAGE
        )


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value)


def _duration(seconds: float | None) -> str:
    """``3h 05m``, ``12m 40s``, ``8s``: how long a pause has lasted."""
    if seconds is None:
        return ""
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


def status_rows(pauses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per queue, then one per tenant pause: every queue shows whether its dispatch
    flows, so a forgotten pause stands out among them."""
    rows: list[dict[str, Any]] = []
    for queue in QUEUES:
        whole = next((p for p in pauses if p["queue"] == queue and p["tenant"] is None), None)
        rows.append({**(whole or {}), "queue": queue, "tenant": None, "paused": whole is not None})
        rows.extend(
            {**p, "paused": True} for p in pauses if p["queue"] == queue and p["tenant"] is not None
        )
    return rows


def status_table(rows: list[dict[str, Any]]) -> Table:
    """Queues and pauses (:func:`status_rows`), fitted to the terminal."""
    return fit(
        [
            Col("queue", lambda r: r["queue"]),
            Col("tenant", lambda r: r["tenant"] or "all"),
            Col("dispatch", lambda r: "PAUSED" if r["paused"] else "flowing"),
            Col("for", lambda r: _duration(r.get("paused_seconds")), justify="right"),
            Col("waiting", lambda r: r.get("waiting", ""), justify="right", priority=1),
            Col("since (UTC)", lambda r: when(r.get("paused_at")), priority=2),
            Col("by", lambda r: r.get("paused_by") or "", priority=3, fold=True),
            Col("reason", lambda r: r.get("reason") or "", priority=1, fold=True),
        ],
        rows,
    )


@queue_app.command("status")
def status(
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Whether each queue's dispatch flows, and every pause in force: whose, why, by whom,
    for how long, and how many exports wait behind it (``GET /v1/admin/queues/pauses``)."""
    need_operator_key(api_key)
    pauses = call(api_url, api_key, "GET", "/v1/admin/queues/pauses")["pauses"]
    emit_rows(status_rows(pauses), mode(output, as_json), status_table, empty="no queues")


def _change(
    verb: str, queue: str, reason: str, tenant: str | None, output: Any, api_url: str, key: str
) -> None:
    need_operator_key(key)
    _check(queue, reason)
    body: dict[str, Any] = {"reason": reason}
    if tenant is not None:
        body["tenant"] = tenant
    row = call(api_url, key, "POST", f"/v1/admin/queues/{queue}/{verb}", body)
    scope = safe(queue) + (f" for tenant {safe(tenant)}" if tenant else "")
    if verb == "pause":
        err.print(f"dispatch of {scope} paused; `exportctl queue resume` lifts it")
    else:
        lasted = (_parse(row["resumed_at"]) - _parse(row["paused_at"])).total_seconds()
        err.print(f"dispatch of {scope} resumed after {_duration(lasted)}")
    emit_object(row, explicit(output), default=lambda _: None)


@queue_app.command("pause")
def pause(
    queue: Queue,
    reason: Reason,
    tenant: Tenant = None,
    output: OutputOpt = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Stop dispatch of QUEUE (or of one ``--tenant`` on it): its exports wait in the outbox,
    queued; running exports finish. Durable until ``queue resume``; an admin operator key.
    Exit 1 when it is paused already (the message says by whom and why)."""
    _change("pause", queue, reason, tenant, output, api_url, api_key)


@queue_app.command("resume")
def resume(
    queue: Queue,
    reason: Reason,
    tenant: Tenant = None,
    output: OutputOpt = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Resume dispatch of QUEUE (or of one ``--tenant``: a tenant's pause and its queue's
    are separate); what waited is sent at once. Exit 1 when it was not paused."""
    _change("resume", queue, reason, tenant, output, api_url, api_key)
