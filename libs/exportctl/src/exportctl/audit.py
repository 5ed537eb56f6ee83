"""``exportctl audit list``: the audit trail through the admin API (an operator key of any
role; docs/operations.md, "The audit trail")."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from exportctl.api import DEFAULT_API_URL, ApiUrl, OperatorKey, emit_api_pages, need_operator_key
from exportctl.common import app, when
from exportctl.output import AllPages, AsJson, OutputOpt, mode
from exportctl.tables import Col, fit, short_id

audit_app = typer.Typer(
    help="The audit trail: who changed what, when (admin API, operator key).",
    no_args_is_help=True,
)
app.add_typer(audit_app, name="audit")


def audit_table(rows: list[dict[str, Any]]) -> Table:
    """Audit entries (``/v1/admin/audit`` items), fitted to the terminal: when, who (folded),
    the action and its target always; the outcome, the count and the tenant give way in that
    order."""

    def target(r: dict[str, Any]) -> str:
        if r.get("job_id"):
            return f"job {short_id(r['job_id'])}"
        return f"{r['target_kind']} {short_id(r.get('target_id') or '')}".strip()

    return fit(
        [
            Col("id", lambda r: r["id"], justify="right"),
            Col("at (UTC)", lambda r: when(r["at"])),
            Col("actor", lambda r: r["actor"], fold=True, fold_width=15),
            Col("action", lambda r: r["action"]),
            Col("target", target, fold=True, fold_width=17),
            Col("outcome", lambda r: r["outcome"], priority=1),
            Col("count", lambda r: "" if r["count"] is None else r["count"], 2, "right"),
            Col("tenant", lambda r: r.get("tenant_id") or "", priority=3),
        ],
        rows,
    )


@audit_app.command("list")
def list_(
    action: Annotated[str | None, typer.Option(help="e.g. replay, bulk_cancel, cancel")] = None,
    actor_kind: Annotated[
        str | None, typer.Option(help="operator | tenant | database | system")
    ] = None,
    key_id: Annotated[str | None, typer.Option(help="the acting key's id")] = None,
    tenant: Annotated[str | None, typer.Option(help="only this tenant's")] = None,
    job: Annotated[str | None, typer.Option(help="only what was done to this export")] = None,
    since: Annotated[str | None, typer.Option(help="at or after (RFC 3339)")] = None,
    until: Annotated[str | None, typer.Option(help="before (RFC 3339)")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="entries per page")] = 50,
    cursor: Annotated[int | None, typer.Option(help="the next page (printed on stderr)")] = None,
    all_pages: AllPages = False,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Audit entries, newest first (``GET /v1/admin/audit``). When more remain, the
    ``--cursor`` of the next page is printed on stderr (``--all`` fetches them all)."""
    need_operator_key(api_key)
    params: dict[str, Any] = {
        "action": action,
        "actor_kind": actor_kind,
        "key_id": key_id,
        "tenant": tenant,
        "job_id": job,
        "since": since,
        "until": until,
        "limit": limit,
    }
    # a --cursor of 0 asks for the first page, as no --cursor does
    emit_api_pages(
        api_url,
        api_key,
        "/v1/admin/audit",
        params,
        cursor or None,
        all_pages,
        mode(output, as_json),
        audit_table,
        empty="no audit entries match",
    )
