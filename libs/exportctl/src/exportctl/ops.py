"""Operator commands: dead letters and replay (through the admin API, with an operator key),
operator keys (database access), and the broker's contents (``broker inspect``).

The dead-letter and replay commands call ``/v1/admin`` with the key in ``OPERATOR_KEY``
(or ``API_KEY``), so the key's kind governs them exactly as it governs HTTP clients and the
operator key is recorded as who replayed or resolved. Only ``dead-letters list --database``
reads PostgreSQL directly (read-only, for when the api is down).
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode
from uuid import UUID

import typer
from rich.table import Table

from exportcore.auth import create_operator_key
from exportcore.db import Row
from exportcore.store import dead_letters as dl_store
from exportcore.store import operator_keys as operator_store
from exportctl.api import DEFAULT_API_URL, ApiUrl, call, call_with_status
from exportctl.common import (
    AsJson,
    add_row,
    app,
    db_pool,
    err,
    fail,
    full_page_last_id,
    id_column,
    key_column,
    print_json,
    print_page,
    print_rows,
    print_value,
    revoke_key,
    safe,
    when,
)

dead_letters_app = typer.Typer(
    help="Dead letters: failed exports that need a person (admin API, operator key).",
    no_args_is_help=True,
)
operator_key_app = typer.Typer(
    help="Operator keys: cross-tenant /v1/admin access (database access; shown once).",
    no_args_is_help=True,
)
app.add_typer(dead_letters_app, name="dead-letters")
app.add_typer(operator_key_app, name="operator-key")

OperatorKey = Annotated[
    str,
    typer.Option(
        "--api-key",
        envvar=["OPERATOR_KEY", "API_KEY"],
        help="an operator key (env OPERATOR_KEY, else API_KEY)",
        show_default=False,
    ),
]
State = Annotated[
    str | None, typer.Option(help="open | replayed | resolved (default: every state)")
]
REASON_HELP = "the dead letters' reason code (e.g. storage_misconfigured)"


def _need_key(api_key: str) -> None:
    if not api_key:
        raise fail(
            "no operator key: set OPERATOR_KEY (made with `exportctl operator-key create "
            "--label NAME`), or pass --api-key",
            2,
        )


def _dead_letter_table(rows: list[dict[str, Any]]) -> Table:
    # the job's id is what `exportctl replay` takes: shown whole, the rest give way
    table = Table(
        "id", id_column("job"), "tenant", "reason", "state", "at", id_column("replay"), "detail"
    )
    for r in rows:
        replay = str(r.get("replayed_by") or "")
        if replay and r.get("replay_status"):
            replay += f" ({r['replay_status']})"
        state = r["state"]
        if state == "resolved":
            state += f" by {r.get('resolved_by') or '?'}"
        add_row(
            table,
            r["id"],
            r["job_id"],
            r["tenant_id"],
            r["reason"],
            state,
            when(r["created_at"]),
            replay,
            str(r["detail"])[:60],
        )
    return table


@dead_letters_app.command("list")
def dead_letters_list(
    state: State = None,
    reason: Annotated[str | None, typer.Option(help="only this reason code")] = None,
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="rows to show")] = 50,
    before: Annotated[int | None, typer.Option(help="show rows with an id below this")] = None,
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
    """Newest dead letters first, with their state and replay."""
    if state is not None and state not in dl_store.DEAD_LETTER_STATES:
        raise fail(f"--state is one of {', '.join(dl_store.DEAD_LETTER_STATES)}", 2)
    if database:
        with db_pool() as pool, pool.connection() as conn:
            rows = dl_store.dead_letters_page(
                conn, limit=limit, before=before, reason=reason, state=state, tenant_id=tenant
            )
        next_before = full_page_last_id(rows, limit)
    else:
        _need_key(api_key)
        params = {"limit": limit, "state": state, "reason": reason, "tenant": tenant}
        params["cursor"] = before
        query = urlencode({k: v for k, v in params.items() if v is not None})
        page = call(api_url, api_key, "GET", f"/v1/admin/dead-letters?{query}")
        rows = page["items"]
        next_before = rows[-1]["id"] if rows and page["next_cursor"] is not None else None
    print_page(rows, as_json, _dead_letter_table, "--before", next_before)


@dead_letters_app.command("resolve")
def dead_letters_resolve(
    dead_letter_id: Annotated[int, typer.Argument(help="the dead letter's id (first column)")],
    note: Annotated[str | None, typer.Option(help="why no (further) replay is needed")] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Close a dead letter without (another) replay; records the operator key and note."""
    _need_key(api_key)
    body = {"note": note} if note is not None else {}
    row = call(api_url, api_key, "POST", f"/v1/admin/dead-letters/{dead_letter_id}/resolve", body)
    err.print(
        f"dead letter {safe(row['id'])} (export {safe(row['job_id'])}) resolved by "
        f"{safe(row['resolved_by'])}"
    )


@dead_letters_app.command("replay-all")
def dead_letters_replay_all(
    reason: Annotated[str, typer.Option(help=REASON_HELP)],
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="dead letters at most")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Replay every OPEN dead letter with REASON (oldest first); idempotent: running it
    again writes no second replay. Exit 1 when admission control stopped it early."""
    _need_key(api_key)
    body: dict[str, Any] = {"reason": reason, "limit": limit}
    if tenant:
        body["tenant"] = tenant
    result = call(api_url, api_key, "POST", "/v1/admin/replays", body)
    if as_json:
        print_json(result)
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
            f"{refused['detail']}); retry in {refused['retry_after']} s"
        )


@app.command()
def replay(
    job_id: Annotated[str, typer.Argument(help="id of a failed export")],
    fmt: Annotated[
        str | None,
        typer.Option("--format", "-f", help="corrected format: json | ndjson | markdown_zip"),
    ] = None,
    note_id: Annotated[
        list[int] | None, typer.Option("--note-id", "-n", help="corrected selection; repeatable")
    ] = None,
    all_notes: Annotated[
        bool, typer.Option("--all", help="corrected selection: every note of the tenant")
    ] = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: OperatorKey = "",
) -> None:
    """Replay a failed export as a NEW job (same snapshot, replay_of = the original), once:
    while its replay is queued or running, or after it succeeded, prints that replay.
    With --format, --note-id or --all, redrive a corrected input instead: a new snapshot of
    the corrected request, validated and admitted like a submit, still replay_of the
    original. Prints the replay's id on stdout."""
    try:
        UUID(job_id)
    except ValueError:
        raise fail(f"{job_id!r} is not an export id (a UUID)", 2) from None
    if note_id and all_notes:
        raise fail("give --note-id (one or more) or --all, not both", 2)
    _need_key(api_key)
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
            f"already replayed: {safe(job['id'])} is {safe(job['status'])} "
            f"(of {safe(job['replay_of'])})"
        )
    print_value(job["id"])


@operator_key_app.command("create")
def operator_key_create(
    label: Annotated[str, typer.Option(help="who holds the key (recorded on what it does)")],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the key")] = False,
) -> None:
    """Create an operator key (cross-tenant /v1/admin); printed once, stored hashed."""
    with db_pool() as pool, pool.connection() as conn:
        try:
            key, row = create_operator_key(conn, label=label)
        except ValueError as exc:
            raise fail(str(exc), 2) from None
    if not quiet:
        err.print(f"operator key [bold]{safe(row['prefix'])}…[/] for {safe(row['label'])}")
        err.print("store it now; it cannot be shown again:")
    print(key)


@operator_key_app.command("list")
def operator_key_list(
    as_json: AsJson = False,
) -> None:
    """Operator keys with their state (never the keys themselves)."""
    with db_pool() as pool, pool.connection() as conn:
        rows = operator_store.operator_key_list(conn)
    print_rows(rows, as_json, operator_key_table)


def operator_key_table(rows: list[Row]) -> Table:
    """Operator key rows (``operator_key_list``); ids and prefixes are never cut."""
    table = Table(id_column("id"), key_column("prefix"), "label", "created", "revoked")
    for r in rows:
        add_row(
            table, r["id"], r["prefix"], r["label"], when(r["created_at"]), when(r["revoked_at"])
        )
    return table


@operator_key_app.command("revoke")
def operator_key_revoke(
    key: Annotated[str, typer.Argument(help="the key's id, or its prefix (nex_op_xxxxxxxx)")],
) -> None:
    """Revoke an operator key at once; requests with it get 401 from then on."""
    row = revoke_key(
        key,
        operator_store.operator_key_revoke,
        operator_store.operator_key_list,
        "operator key",
        "exportctl operator-key list",
    )
    err.print(
        f"revoked operator key {safe(row['prefix'])}… ({safe(row['id'])}, {safe(row['label'])})"
    )
