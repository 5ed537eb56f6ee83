"""``exportctl tenant create | list | set-quota | set-rate | set-in-flight |
set-recipients``: tenants, their limits and the age recipients of their exports (database:
``DATABASE_URL``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import psycopg
import typer
from rich.table import Table

from exportcore.db import Row
from exportcore.encryption import parse_recipients
from exportcore.store import console as console_store
from exportcore.store import tenants as tenant_store
from exportctl.common import (
    app,
    db_pool,
    err,
    fail,
    load_settings,
    safe,
    when,
)
from exportctl.exits import EXIT_NOT_FOUND
from exportctl.output import AllPages, AsJson, OutputOpt, emit_keyset_pages, mode
from exportctl.tables import Col, fit

tenant_app = typer.Typer(help="Tenants.", no_args_is_help=True)
app.add_typer(tenant_app, name="tenant")

PG_INTEGER_MAX = 2**31 - 1  # tenants.max_active_jobs is a PostgreSQL integer


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
    err.print(f"tenant [bold]{safe(row['id'])}[/] ready")


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
        raise fail(f"no tenant {tenant_id!r}", EXIT_NOT_FOUND)
    shown = row["max_active_jobs"]
    if shown is None:
        err.print(
            f"tenant {safe(tenant_id)}: default quota ({settings.tenant_active_quota} active jobs)"
        )
    else:
        err.print(f"tenant {safe(tenant_id)}: quota {shown} active jobs")


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
        raise fail(f"no tenant {tenant_id!r}", EXIT_NOT_FOUND)
    shown_rate = row["submit_rate"] or settings.tenant_submit_rate
    shown_burst = row["submit_burst"] or settings.tenant_submit_burst
    kind = "default rate" if row["submit_rate"] is None else "rate"
    err.print(
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
        raise fail(f"no tenant {tenant_id!r}", EXIT_NOT_FOUND)
    shown = []
    for queue, column, default in (
        ("bulk", "bulk_in_flight", settings.tenant_bulk_in_flight),
        ("fast", "fast_in_flight", settings.tenant_fast_in_flight),
    ):
        value = row[column]
        shown.append(f"{queue} {default} (default)" if value is None else f"{queue} {value}")
    err.print(f"tenant {safe(tenant_id)}: in flight at most {', '.join(shown)}")


@tenant_app.command("set-recipients")
def tenant_set_recipients(
    tenant_id: Annotated[str, typer.Argument(help="the tenant")],
    recipients: Annotated[
        list[str] | None,
        typer.Argument(help="age public keys (age1…); none: clear them", show_default=False),
    ] = None,
) -> None:
    """Encrypt every export of the tenant to these age X25519 recipients (public keys,
    ``age1…``, as ``age-keygen -y`` prints them; at most 16), beside any a request names;
    without RECIPIENTS, clear them (its exports are then encrypted only when a request asks).
    Workers apply it to every export they render from then on (docs/api.md "Encrypted
    exports")."""
    keys: list[str] | None = None
    if recipients:
        try:
            keys = list(parse_recipients(recipients))
        except ValueError as exc:
            raise fail(f"{exc}; nothing changed", 2) from None
    with db_pool() as pool, pool.connection() as conn:
        row = tenant_store.tenant_set_recipients(conn, tenant_id=tenant_id, recipients=keys)
    if row is None:
        raise fail(f"no tenant {tenant_id!r}", EXIT_NOT_FOUND)
    if not keys:
        err.print(f"tenant {safe(tenant_id)}: no age recipients (exports not encrypted)")
    else:
        listed = ", ".join(keys)
        err.print(
            f"tenant {safe(tenant_id)}: every export encrypted to {len(keys)} age "
            f"recipient{'s' if len(keys) > 1 else ''}: {safe(listed)}"
        )


@tenant_app.command("list")
def tenant_list(
    prefix: Annotated[str | None, typer.Option(help="only ids starting with this")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="tenants to show")] = 100,
    after: Annotated[str | None, typer.Option(help="show tenants with an id after this")] = None,
    all_pages: AllPages = False,
    output: OutputOpt = None,
    as_json: AsJson = False,
) -> None:
    """Tenants by id with their quota, active jobs, refused submits of the last hour and
    schedules (database: DATABASE_URL). When more remain, the next ``--after`` is printed
    on stderr; ``--all`` reads every page."""
    settings = load_settings()
    with db_pool() as pool:
        emit_keyset_pages(
            pool,
            lambda conn, start: console_store.tenants_page(
                conn,
                limit=limit,
                default_quota=settings.tenant_active_quota,
                after=start,
                prefix=prefix,
            ),
            limit,
            after,
            all_pages,
            mode(output, as_json),
            tenant_table,
            empty="no tenants",
        )


def tenant_table(rows: Sequence[Row]) -> Table:
    """Tenant rows (``console_tenants_page``), fitted to the terminal; ids are never cut."""

    def quota(r: Row) -> str:
        return f"{r['quota']}" + (" (default)" if r["max_active_jobs"] is None else "")

    return fit(
        [
            Col("id", lambda r: r["id"]),
            Col("name", lambda r: r["name"], priority=3, fold=True),
            Col("quota", quota),
            Col("queued", lambda r: r["queued"], justify="right"),
            Col("running", lambda r: r["running"], justify="right"),
            Col("refused (1 h)", lambda r: r["refused_last_hour"], 2, "right"),
            Col("schedules", lambda r: r["schedules"], 4, "right"),
            Col("created (UTC)", lambda r: when(r["created_at"]), priority=5),
        ],
        rows,
    )
