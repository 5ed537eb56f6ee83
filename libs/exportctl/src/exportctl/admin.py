"""Database-side commands: migrate, tenant, apikey, notes (import, list)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import psycopg
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from exportcore.auth import DEFAULT_SCOPES, SCOPES, create_api_key
from exportcore.db import Row
from exportcore.store import api_keys as api_key_store
from exportcore.store import console as console_store
from exportcore.store import notes as note_store
from exportcore.store import tenants as tenant_store
from exportctl.common import (
    AsJson,
    add_row,
    apikey_app,
    app,
    db_pool,
    err,
    fail,
    full_page_last_id,
    id_column,
    key_column,
    load_settings,
    notes_app,
    out,
    print_page,
    print_rows,
    revoke_key,
    safe,
    tenant_app,
    when,
)
from exportctl.importer import DEFAULT_MAX_BYTES, import_notes

PG_INTEGER_MAX = 2**31 - 1  # tenants.max_active_jobs is a PostgreSQL integer


@app.command()
def migrate(
    revision: Annotated[str, typer.Argument(help="target revision")] = "head",
    config: Annotated[
        Path, typer.Option(help="alembic.ini (default: ./alembic.ini or $ALEMBIC_CONFIG)")
    ] = Path(os.environ.get("ALEMBIC_CONFIG", "alembic.ini")),
    downgrade: Annotated[bool, typer.Option(help="downgrade to REVISION instead")] = False,
) -> None:
    """Apply the Alembic migrations to DATABASE_URL (over DATABASE_DIRECT_URL when set: a
    migration needs a session of its own, never a transaction pooler; idempotent)."""
    from alembic import command
    from alembic.config import Config

    load_settings()
    if not config.is_file():
        raise fail(f"{config} not found; run from the project root or pass --config")
    cfg = Config(str(config))
    try:
        if downgrade:
            command.downgrade(cfg, revision)
        else:
            command.upgrade(cfg, revision)
    except Exception as exc:
        raise fail(f"migration failed: {type(exc).__name__}: {exc}") from None
    out.print(f"[green]database {'downgraded' if downgrade else 'upgraded'} to {safe(revision)}")


@tenant_app.command("create")
def tenant_create(
    tenant_id: Annotated[str, typer.Argument(help="lowercase id: letters, digits, dashes")],
    name: Annotated[str | None, typer.Option(help="display name (default: the id)")] = None,
) -> None:
    """Create a tenant (or rename an existing one)."""
    with db_pool() as pool, pool.connection() as conn:
        try:
            row = tenant_store.tenant_upsert(conn, tenant_id=tenant_id, name=name or tenant_id)
        except psycopg.errors.CheckViolation:
            raise fail(
                f"invalid tenant id {tenant_id!r}: use 1-63 lowercase letters, digits or dashes, "
                "starting with a letter or digit"
            ) from None
    out.print(f"tenant [bold]{safe(row['id'])}[/] ready")


@apikey_app.command("create")
def apikey_create(
    tenant_id: Annotated[str, typer.Argument(help="the tenant the key acts for")],
    scope: Annotated[
        list[str] | None, typer.Option("--scope", help=f"repeatable; one of {', '.join(SCOPES)}")
    ] = None,
    label: Annotated[str, typer.Option(help="a note for operators")] = "",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the key")] = False,
) -> None:
    """Create an API key; the key is printed once and never stored."""
    scopes = list(scope or DEFAULT_SCOPES)
    with db_pool() as pool, pool.connection() as conn:
        if tenant_store.tenant_get(conn, tenant_id=tenant_id) is None:
            raise fail(
                f"no tenant {tenant_id!r}; create it with `exportctl tenant create {tenant_id}`"
            )
        try:
            key, row = create_api_key(conn, tenant_id=tenant_id, scopes=scopes, label=label)
        except ValueError as exc:
            raise fail(str(exc)) from None
    if quiet:
        print(key)
        return
    out.print(
        f"key [bold]{safe(row['prefix'])}…[/] for tenant {safe(tenant_id)}, "
        f"scopes {safe(', '.join(row['scopes']))}"
    )
    out.print("store it now; it cannot be shown again:")
    print(key)


@notes_app.command("import")
def notes_import(
    folder: Annotated[Path, typer.Argument(help="a folder of .md / .markdown / .txt notes")],
    tenant: Annotated[str, typer.Option("--tenant", "-t", help="tenant id")],
    max_bytes: Annotated[int, typer.Option(help="skip files larger than this")] = DEFAULT_MAX_BYTES,
    show_skipped: Annotated[int, typer.Option(help="list at most this many skipped files")] = 50,
) -> None:
    """Import notes from FOLDER; idempotent per (tenant, relative path)."""
    if not folder.is_dir():
        raise fail(f"{folder} is not a folder")
    with db_pool() as pool:
        with pool.connection() as conn:
            if tenant_store.tenant_get(conn, tenant_id=tenant) is None:
                raise fail(
                    f"no tenant {tenant!r}; create it with `exportctl tenant create {tenant}`"
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
                pool, tenant, folder, max_bytes=max_bytes, on_progress=on_progress
            )
    out.print(
        f"[green]imported {report.inserted} new, {report.updated} changed[/], "
        f"{report.unchanged} unchanged, {len(report.skipped)} skipped, "
        f"{report.ignored} other files ignored"
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


@tenant_app.command("set-quota")
def tenant_set_quota(
    tenant_id: Annotated[str, typer.Argument(help="the tenant")],
    quota: Annotated[
        int | None,
        typer.Argument(
            min=0, max=PG_INTEGER_MAX, help="active jobs at most; omit to use the default"
        ),
    ] = None,
) -> None:
    """Override the tenant's quota of active (queued + running) jobs."""
    settings = load_settings()
    with db_pool() as pool, pool.connection() as conn:
        row = tenant_store.tenant_set_quota(conn, tenant_id=tenant_id, quota=quota)
    if row is None:
        raise fail(f"no tenant {tenant_id!r}")
    shown = row["max_active_jobs"]
    if shown is None:
        out.print(
            f"tenant {safe(tenant_id)}: default quota ({settings.tenant_active_quota} active jobs)"
        )
    else:
        out.print(f"tenant {safe(tenant_id)}: quota {shown} active jobs")


@tenant_app.command("set-rate")
def tenant_set_rate(
    tenant_id: Annotated[str, typer.Argument(help="the tenant")],
    rate: Annotated[
        float | None,
        typer.Argument(
            min=0.001, max=1e9, help="submits per second sustained; omit to use the default"
        ),
    ] = None,
    burst: Annotated[
        int | None,
        typer.Option(min=1, max=PG_INTEGER_MAX, help="submits at once (omit: the default)"),
    ] = None,
) -> None:
    """Override the tenant's submit rate limit (a token bucket: RATE per second, BURST at
    once); without RATE both return to the defaults. api processes apply it within
    TENANT_LIMITS_CACHE_SECONDS."""
    settings = load_settings()
    if rate is None and burst is not None:
        raise fail("give RATE with --burst (without RATE both return to the defaults)", 2)
    with db_pool() as pool, pool.connection() as conn:
        row = tenant_store.tenant_set_rate(conn, tenant_id=tenant_id, rate=rate, burst=burst)
    if row is None:
        raise fail(f"no tenant {tenant_id!r}")
    shown_rate = row["submit_rate"] or settings.tenant_submit_rate
    shown_burst = row["submit_burst"] or settings.tenant_submit_burst
    kind = "default rate" if row["submit_rate"] is None else "rate"
    out.print(
        f"tenant {safe(tenant_id)}: {kind} {shown_rate:g} submits/s, bursts of {shown_burst}"
        f"{' (default)' if row['submit_burst'] is None else ''}"
    )


@tenant_app.command("set-in-flight")
def tenant_set_in_flight(
    tenant_id: Annotated[str, typer.Argument(help="the tenant")],
    bulk: Annotated[
        int | None,
        typer.Option(
            min=1, max=PG_INTEGER_MAX, help="jobs in flight on exports.bulk (omit: the default)"
        ),
    ] = None,
    fast: Annotated[
        int | None,
        typer.Option(
            min=1, max=PG_INTEGER_MAX, help="jobs in flight on exports.fast (omit: the default)"
        ),
    ] = None,
) -> None:
    """Override the tenant's in-flight caps (fair dispatch: jobs dispatched to the broker or
    running at once, per queue); an omitted queue returns to its default. The publishers
    apply it on their next pass."""
    settings = load_settings()
    with db_pool() as pool, pool.connection() as conn:
        row = tenant_store.tenant_set_in_flight(conn, tenant_id=tenant_id, bulk=bulk, fast=fast)
    if row is None:
        raise fail(f"no tenant {tenant_id!r}")
    shown = []
    for queue, column, default in (
        ("bulk", "bulk_in_flight", settings.tenant_bulk_in_flight),
        ("fast", "fast_in_flight", settings.tenant_fast_in_flight),
    ):
        value = row[column]
        shown.append(f"{queue} {default} (default)" if value is None else f"{queue} {value}")
    out.print(f"tenant {safe(tenant_id)}: in flight at most {', '.join(shown)}")


@apikey_app.command("revoke")
def apikey_revoke(
    key: Annotated[str, typer.Argument(help="the key's id, or its prefix (nex_xxxxxxxx)")],
) -> None:
    """Revoke a key at once; requests with it get 401 from then on."""
    row = revoke_key(
        key,
        api_key_store.api_key_revoke,
        api_key_store.api_key_list,
        "key",
        "exportctl apikey list",
    )
    out.print(
        f"revoked {safe(row['prefix'])}… ({safe(row['id'])}) of tenant {safe(row['tenant_id'])}"
    )


@apikey_app.command("list")
def apikey_list(
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="one tenant only")] = None,
    as_json: AsJson = False,
) -> None:
    """Keys with their scopes and state (never the keys themselves)."""
    with db_pool() as pool, pool.connection() as conn:
        rows = api_key_store.api_key_list(conn, tenant_id=tenant)
    print_rows(rows, as_json, apikey_table)


def apikey_table(rows: Sequence[Row]) -> Table:
    """API key rows (``api_key_list``) as a table; ids and prefixes are never cut."""
    table = Table(
        id_column("id"), "tenant", key_column("prefix"), "scopes", "label", "created", "revoked"
    )
    for r in rows:
        add_row(
            table,
            r["id"],
            r["tenant_id"],
            r["prefix"],
            ", ".join(r["scopes"]),
            r["label"],
            r["created_at"].strftime("%Y-%m-%d %H:%M"),
            r["revoked_at"].strftime("%Y-%m-%d %H:%M") if r["revoked_at"] else "",
        )
    return table


@tenant_app.command("list")
def tenant_list(
    prefix: Annotated[str | None, typer.Option(help="only ids starting with this")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="tenants to show")] = 100,
    after: Annotated[str | None, typer.Option(help="show tenants with an id after this")] = None,
    as_json: AsJson = False,
) -> None:
    """Tenants by id with their quota, active jobs, refused submits of the last hour and
    schedules (database: DATABASE_URL). When more remain, the next ``--after`` is printed
    on stderr."""
    settings = load_settings()
    with db_pool() as pool, pool.connection() as conn:
        rows = console_store.tenants_page(
            conn,
            limit=limit,
            default_quota=settings.tenant_active_quota,
            after=after,
            prefix=prefix,
        )
    print_page(rows, as_json, tenant_table, "--after", full_page_last_id(rows, limit))


def tenant_table(rows: Sequence[Row]) -> Table:
    """Tenant rows (``console_tenants_page``) as a table; ids are never cut."""
    table = Table(
        Column("id", no_wrap=True, overflow="fold"),
        "name",
        "quota",
        "queued",
        "running",
        "refused (1 h)",
        "schedules",
        "created (UTC)",
    )
    for r in rows:
        quota = f"{r['quota']}" + (" (default)" if r["max_active_jobs"] is None else "")
        add_row(
            table,
            r["id"],
            r["name"],
            quota,
            r["queued"],
            r["running"],
            r["refused_last_hour"],
            r["schedules"],
            when(r["created_at"]),
        )
    return table


@notes_app.command("list")
def notes_list(
    tenant: Annotated[str, typer.Option("--tenant", "-t", help="tenant id")],
    limit: Annotated[int, typer.Option(min=1, max=1000, help="notes to show")] = 100,
    after: Annotated[int | None, typer.Option(help="show notes with an id above this")] = None,
    as_json: AsJson = False,
) -> None:
    """The tenant's notes by id: title, source file, size, pinned (never the content;
    database: DATABASE_URL). Their ids are what ``exportctl submit --note-id`` takes. When
    more remain, the next ``--after`` is printed on stderr."""
    with db_pool() as pool, pool.connection() as conn:
        if tenant_store.tenant_get(conn, tenant_id=tenant) is None:
            raise fail(f"no tenant {tenant!r}; `exportctl tenant list` shows them")
        rows = note_store.notes_page(conn, tenant_id=tenant, limit=limit, after=after)
    print_page(rows, as_json, notes_table, "--after", full_page_last_id(rows, limit))


def notes_table(rows: Sequence[Row]) -> Table:
    """Note rows (``notes_page``) as a table: titles and file names print as text."""
    table = Table(
        Column("id", no_wrap=True, justify="right"),
        "title",
        "file",
        "bytes",
        "pinned",
        "updated (UTC)",
    )
    for r in rows:
        add_row(
            table,
            r["id"],
            r["title"],
            r["source_path"],
            r["bytes"],
            "yes" if r["pinned"] else "",
            when(r["updated_at"]),
        )
    return table
