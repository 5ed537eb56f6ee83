"""``exportctl notes import | delete | list``: the notes users export (database: ``DATABASE_URL``;
the importer itself is :mod:`exportctl.importer`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from exportcore.audit import Actor
from exportcore.db import Row, transaction
from exportcore.domain import count_of
from exportcore.store import notes as note_store
from exportcore.store import tenants as tenant_store
from exportctl.common import add_row, app, db_pool, err, fail, safe, when
from exportctl.exits import EXIT_NOT_FOUND
from exportctl.importer import DEFAULT_MAX_BYTES, import_notes, record_notes_deleted
from exportctl.output import (
    AllPages,
    AsJson,
    OutputOpt,
    emit_keyset_pages,
    emit_object,
    explicit,
    mode,
)
from exportctl.tables import Col, fit

notes_app = typer.Typer(help="The notes users export.", no_args_is_help=True)
app.add_typer(notes_app, name="notes")


@notes_app.command("import")
def notes_import(
    folder: Annotated[Path, typer.Argument(help="a folder of .md / .markdown / .txt notes")],
    tenant: Annotated[str, typer.Option("--tenant", "-t", help="tenant id")],
    max_bytes: Annotated[int, typer.Option(help="skip files larger than this")] = DEFAULT_MAX_BYTES,
    show_skipped: Annotated[int, typer.Option(help="list at most this many skipped files")] = 50,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace", help="also delete the tenant's imported notes whose file is gone"
        ),
    ] = False,
    output: OutputOpt = None,
) -> None:
    """Import notes from FOLDER; idempotent per (tenant, relative path). ``--replace``
    deletes imported notes whose file is no longer there (each leaves a tombstone). Each
    batch that changes notes is audited (``notes_import``; ``notes_delete`` for the
    replace), naming the operating-system user and host."""
    if not folder.is_dir():
        raise fail(f"{folder} is not a folder")
    with db_pool() as pool:
        with pool.connection() as conn:
            if tenant_store.tenant_get(conn, tenant_id=tenant) is None:
                raise fail(
                    f"no tenant {tenant!r}; create it with `exportctl tenant create {tenant}`",
                    EXIT_NOT_FOUND,
                )
        progress = Progress(
            TextColumn("importing"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        )
        with progress:
            task = progress.add_task("import", total=None)

            def on_progress(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

            report = import_notes(
                pool,
                tenant,
                folder,
                max_bytes=max_bytes,
                on_progress=on_progress,
                replace=replace,
                actor=Actor.database(),
            )
    summary = {
        "inserted": report.inserted,
        "updated": report.updated,
        "unchanged": report.unchanged,
        "deleted": report.deleted,
        "ignored": report.ignored,
        "skipped": [{"path": p, "reason": r} for p, r in report.skipped],
        "warnings": [{"path": p, "warning": w} for p, w in report.warnings],
    }
    emit_object(
        summary,
        explicit(output),
        default=lambda _: err.print(
            f"[green]imported {report.inserted} new, {report.updated} changed[/], "
            f"{report.unchanged} unchanged, {report.deleted} deleted, "
            f"{len(report.skipped)} skipped, "
            f"{report.ignored} other files ignored"
        ),
    )
    if report.skipped:
        err.print(skipped_table(report.skipped[:show_skipped]))
        if len(report.skipped) > show_skipped:
            err.print(f"… and {len(report.skipped) - show_skipped} more")
    for path, warning in report.warnings[:show_skipped]:
        err.print(f"[yellow]warning:[/] {safe(path)}: {safe(warning)}")


def skipped_table(skipped: Sequence[tuple[str, str]]) -> Table:
    """The files an import skipped: ``(relative path, reason)`` pairs, printed as text (a file
    name may hold markup or escape sequences)."""
    table = Table("skipped file", "reason", title="not imported")
    for path, reason in skipped:
        add_row(table, path, reason)
    return table


@notes_app.command("delete")
def notes_delete(
    note_ids: Annotated[list[int], typer.Argument(help="ids of the notes to delete")],
    tenant: Annotated[str, typer.Option("--tenant", "-t", help="tenant id")],
    output: OutputOpt = None,
) -> None:
    """Delete notes of a tenant (database: DATABASE_URL); each leaves a tombstone that the
    next delta export carries, and the deletion its audit row (``notes_delete``, in the same
    transaction, naming the operating-system user and host). Ids that are not the tenant's
    are listed and left alone (exit 5, not found). ``--output json``: ``{"deleted": [ids],
    "missing": [ids]}``."""
    with db_pool() as pool, transaction(pool) as conn:
        if tenant_store.tenant_get(conn, tenant_id=tenant) is None:
            raise fail(f"no tenant {tenant!r}; `exportctl tenant list` shows them", EXIT_NOT_FOUND)
        deleted = set(note_store.notes_delete_many(conn, tenant_id=tenant, note_ids=note_ids))
        if deleted:
            record_notes_deleted(conn, Actor.database(), tenant, list(deleted))
    missing = sorted(set(note_ids) - deleted)

    def say(_: Any) -> None:
        err.print(f"[green]deleted {count_of(len(deleted), 'note')}[/]")
        if missing:
            err.print(f"[yellow]not notes of {safe(tenant)}:[/] {', '.join(map(str, missing))}")

    emit_object({"deleted": sorted(deleted), "missing": missing}, explicit(output), default=say)
    if missing:
        raise typer.Exit(EXIT_NOT_FOUND)


@notes_app.command("list")
def notes_list(
    tenant: Annotated[str, typer.Option("--tenant", "-t", help="tenant id")],
    limit: Annotated[int, typer.Option(min=1, max=1000, help="notes to show")] = 100,
    after: Annotated[int | None, typer.Option(help="show notes with an id above this")] = None,
    all_pages: AllPages = False,
    output: OutputOpt = None,
    as_json: AsJson = False,
) -> None:
    """The tenant's notes by id: title, source file, size, pinned (never the content;
    database: DATABASE_URL). Their ids are what ``exportctl submit --note-id`` takes. When
    more remain, the next ``--after`` is printed on stderr; ``--all`` reads every page."""
    with db_pool() as pool:
        with pool.connection() as conn:
            if tenant_store.tenant_get(conn, tenant_id=tenant) is None:
                raise fail(
                    f"no tenant {tenant!r}; `exportctl tenant list` shows them", EXIT_NOT_FOUND
                )

        emit_keyset_pages(
            pool,
            lambda conn, start: note_store.notes_page(
                conn, tenant_id=tenant, limit=limit, after=start
            ),
            limit,
            after,
            all_pages,
            mode(output, as_json),
            notes_table,
            empty=f"tenant {tenant} has no notes",
        )


def notes_table(rows: Sequence[Row]) -> Table:
    """Note rows (``notes_page``), fitted to the terminal: titles and file names print as
    text and fold."""
    return fit(
        [
            Col("id", lambda r: r["id"], justify="right"),
            Col("title", lambda r: r["title"], fold=True),
            Col("file", lambda r: r["source_path"], priority=2, fold=True),
            Col("bytes", lambda r: r["bytes"], priority=1, justify="right"),
            Col("pinned", lambda r: "yes" if r["pinned"] else "", priority=3),
            Col("updated (UTC)", lambda r: when(r["updated_at"]), priority=4),
        ],
        rows,
    )
