"""Operator commands on failed work: list dead letters, replay a failed export."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

import typer
from rich.table import Table

from exportcore.cli.common import app, db_pool, fail, id_column, load_settings, out
from exportcore.domain import ExportError
from exportcore.store import dead_letters as dl_store
from exportcore.submit import replay_export

dead_letters_app = typer.Typer(
    help="Dead letters: failed exports that need a person.", no_args_is_help=True
)
app.add_typer(dead_letters_app, name="dead-letters")


@dead_letters_app.command("list")
def dead_letters_list(
    reason: Annotated[str | None, typer.Option(help="only this reason code")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="rows to show")] = 50,
    before: Annotated[int | None, typer.Option(help="show rows with an id below this")] = None,
) -> None:
    """Newest dead letters first, with their reason and replay (if any)."""
    with db_pool() as pool, pool.connection() as conn:
        rows = dl_store.dead_letters_page(conn, limit=limit, before=before, reason=reason)
    # the job's id is what `exportctl replay` takes: shown whole, the rest give way
    table = Table(
        "id", id_column("job"), "tenant", "reason", "attempts", "at", "replayed by", "detail"
    )
    for r in rows:
        table.add_row(
            str(r["id"]),
            str(r["job_id"]),
            r["tenant_id"],
            r["reason"],
            str(r["attempts"]),
            r["created_at"].strftime("%Y-%m-%d %H:%M:%S"),
            str(r["replayed_by"] or ""),
            r["detail"][:60],
        )
    out.print(table)
    if len(rows) == limit:
        out.print(f"more: --before {rows[-1]['id']}")


@app.command()
def replay(job_id: Annotated[str, typer.Argument(help="id of a failed export")]) -> None:
    """Replay a failed export as a NEW job (same snapshot, replay_of = the original)."""
    try:
        original = UUID(job_id)
    except ValueError:
        raise fail(f"{job_id!r} is not an export id (a UUID)", 2) from None
    settings = load_settings()
    with db_pool() as pool:
        try:
            job = replay_export(pool, settings, original_id=original)
        except ExportError as exc:
            raise fail(exc.detail) from None
    out.print(f"replay accepted: [bold]{job['id']}[/] (queue {job['queue']})")
    print(job["id"])
