"""``exportctl dead-letters list | resolve | replay-all`` and ``exportctl replay``: failed
exports that need a person, through the admin API with an operator key.

The dead-letter and replay commands call ``/v1/admin`` with the key in ``OPERATOR_KEY``
(or ``API_KEY``), so the key's kind governs them exactly as it governs HTTP clients and the
operator key is recorded as who replayed or resolved. Only ``dead-letters list --database``
reads PostgreSQL directly (read-only, for when the api is down).
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

import typer
from rich.table import Table

from exportcore.domain import status_words
from exportcore.store import dead_letters as dl_store
from exportctl.api import (
    DEFAULT_API_URL,
    ApiUrl,
    OperatorKey,
    call,
    call_with_status,
    need_operator_key,
)
from exportctl.common import (
    app,
    completes,
    db_pool,
    err,
    fail,
    full_page_last_id,
    print_value,
    safe,
    when,
)
from exportctl.exits import EXIT_UNAVAILABLE, EXIT_USAGE
from exportctl.exports import FORMATS, check_export_id, check_format
from exportctl.output import AllPages, AsJson, OutputOpt, emit_object, emit_paged, explicit, mode
from exportctl.tables import Col, fit, short_id

dead_letters_app = typer.Typer(
    help="Dead letters: failed exports that need a person (admin API, operator key).",
    no_args_is_help=True,
)
app.add_typer(dead_letters_app, name="dead-letters")

State = Annotated[
    str | None, typer.Option(help="open | replayed | resolved (default: every state)")
]
REASON_HELP = "the dead letters' reason code (e.g. storage_misconfigured)"


def _dead_letter_table(rows: list[dict[str, Any]]) -> Table:
    """Dead letters, fitted to the terminal: the id (what ``resolve`` takes), the job's id
    (what ``replay`` takes, whole) and the state always; the rest gives way."""

    def replay(r: dict[str, Any]) -> str:
        text = short_id(r.get("replayed_by") or "")
        return f"{text} ({r['replay_status']})" if text and r.get("replay_status") else text

    def state(r: dict[str, Any]) -> str:
        if r["state"] == "resolved":
            return f"resolved by {r.get('resolved_by') or '?'}"
        return str(r["state"])

    return fit(
        [
            Col("id", lambda r: r["id"], justify="right"),
            Col("job", lambda r: r["job_id"]),
            Col("state", state, fold=True),
            Col("reason", lambda r: r["reason"], priority=1),
            Col("tenant", lambda r: r["tenant_id"], priority=2),
            Col("at (UTC)", lambda r: when(r["created_at"]), priority=3),
            Col("replay", replay, priority=4),
            Col("detail", lambda r: str(r["detail"])[:60], priority=5, fold=True),
        ],
        rows,
    )


@dead_letters_app.command("list")
def dead_letters_list(
    state: State = None,
    reason: Annotated[str | None, typer.Option(help="only this reason code")] = None,
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="rows to show")] = 50,
    before: Annotated[int | None, typer.Option(help="show rows with an id below this")] = None,
    all_pages: AllPages = False,
    output: OutputOpt = None,
    as_json: AsJson = False,
    database: Annotated[
        bool,
        typer.Option(
            "--database", help="read PostgreSQL (DATABASE_URL) directly instead of the API"
        ),
    ] = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Newest dead letters first, with their state and replay. When more remain, the
    ``--before`` of the next page is printed on stderr; ``--all`` reads every page."""
    if state is not None and state not in dl_store.DEAD_LETTER_STATES:
        raise fail(f"--state is one of {', '.join(dl_store.DEAD_LETTER_STATES)}", EXIT_USAGE)
    if not database:
        need_operator_key(api_key)

    def page_at(start: int | None) -> tuple[list[Any], int | None]:
        if database:
            with db_pool() as pool, pool.connection() as conn:
                rows = dl_store.dead_letters_page(
                    conn, limit=limit, before=start, reason=reason, state=state, tenant_id=tenant
                )
            return rows, full_page_last_id(rows, limit)  # type: ignore[return-value]
        params = {"limit": limit, "state": state, "reason": reason, "tenant": tenant}
        params["cursor"] = start
        query = urlencode({k: v for k, v in params.items() if v is not None})
        page = call(api_url, api_key, "GET", f"/v1/admin/dead-letters?{query}")
        rows = page["items"]
        return rows, rows[-1]["id"] if rows and page["next_cursor"] is not None else None

    emit_paged(
        page_at,
        before,
        all_pages,
        mode(output, as_json),
        _dead_letter_table,
        next_option="--before",
        empty="no dead letters match",
    )


@dead_letters_app.command("resolve")
def dead_letters_resolve(
    dead_letter_id: Annotated[int, typer.Argument(help="the dead letter's id (first column)")],
    note: Annotated[str | None, typer.Option(help="why no (further) replay is needed")] = None,
    output: OutputOpt = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Close a dead letter without (another) replay; records the operator key and note."""
    need_operator_key(api_key)
    body = {"note": note} if note is not None else {}
    row = call(api_url, api_key, "POST", f"/v1/admin/dead-letters/{dead_letter_id}/resolve", body)
    err.print(
        f"dead letter {safe(row['id'])} (export {safe(row['job_id'])}) resolved by "
        f"{safe(row['resolved_by'])}"
    )
    emit_object(row, explicit(output), default=lambda _: None)


@dead_letters_app.command("replay-all")
def dead_letters_replay_all(
    reason: Annotated[str, typer.Option(help=REASON_HELP)],
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="dead letters at most")] = 100,
    output: OutputOpt = None,
    as_json: AsJson = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Replay every OPEN dead letter with REASON (oldest first); idempotent: running it
    again writes no second replay. Exit 1 when admission control stopped it early."""
    need_operator_key(api_key)
    body: dict[str, Any] = {"reason": reason, "limit": limit}
    if tenant:
        body["tenant"] = tenant
    result = call(api_url, api_key, "POST", "/v1/admin/replays", body)
    how = explicit(output, as_json)
    if how is not None:
        emit_object(result, how)
    else:
        for item in result["created"]:
            print_value(item["replay_id"])
        err.print(
            f"reason {safe(reason)}: {len(result['created'])} replayed, "
            f"{len(result['existing'])} already had a replay, {len(result['skipped'])} skipped"
        )
        for item in result["skipped"]:
            err.print(f"  skipped {safe(item['job_id'])}: {safe(item['detail'])}")
        if result["more"]:
            err.print("more open dead letters remain: run it again")
    if result["refused"]:
        refused = result["refused"]
        raise fail(
            f"admission refused at export {refused['job_id']} ({refused['code']}: "
            f"{refused['detail']}); retry in {refused['retry_after']} s",
            EXIT_UNAVAILABLE,
        )


@app.command()
def replay(
    job_id: Annotated[str, typer.Argument(help="id of a failed export")],
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            "-f",
            help="corrected format: json | ndjson | markdown_zip",
            autocompletion=completes(*FORMATS),
        ),
    ] = None,
    note_id: Annotated[
        list[int] | None, typer.Option("--note-id", "-n", help="corrected selection; repeatable")
    ] = None,
    all_notes: Annotated[
        bool, typer.Option("--all", help="corrected selection: every note of the tenant")
    ] = False,
    output: OutputOpt = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Replay a failed export as a NEW job (same snapshot, replay_of = the original), once:
    while its replay is queued or running, or after it succeeded, prints that replay.
    With --format, --note-id or --all, redrive a corrected input instead: a new snapshot of
    the corrected request, validated and admitted like a submit, still replay_of the
    original. Prints the replay's id on stdout."""
    check_export_id(job_id)
    if fmt is not None:
        check_format(fmt)
    if note_id and all_notes:
        raise fail("give --note-id (one or more) or --all, not both", EXIT_USAGE)
    need_operator_key(api_key)
    correction: dict[str, Any] = {"format": fmt} if fmt else {}
    correction.update({"all": True} if all_notes else {"note_ids": note_id} if note_id else {})
    status, job = call_with_status(
        api_url, api_key, "POST", f"/v1/admin/exports/{job_id}/replay", correction or None
    )
    if status == 202:
        err.print(
            f"replay accepted: {safe(job['id'])} (queue {safe(job['queue'])}, "
            f"of {safe(job['replay_of'])})"
        )
    else:
        err.print(
            f"already replayed: {safe(job['id'])} {safe(status_words(str(job['status'])))} "
            f"(a replay of {safe(job['replay_of'])})"
        )
    emit_object(job, explicit(output), default=lambda j: print_value(j["id"]))
