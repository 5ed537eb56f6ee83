"""``exportctl apikey create | list | revoke``: tenants' API keys (database:
``DATABASE_URL``; a key is shown once at creation and stored only as a hash)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer
from rich.table import Table

from exportcore.auth import DEFAULT_SCOPES, SCOPES, create_api_key
from exportcore.db import Row
from exportcore.store import api_keys as api_key_store
from exportcore.store import tenants as tenant_store
from exportctl.common import (
    AsJson,
    add_row,
    app,
    db_pool,
    fail,
    id_column,
    key_column,
    out,
    print_rows,
    revoke_key,
    safe,
)

apikey_app = typer.Typer(
    help="API keys (shown once at creation, stored hashed).", no_args_is_help=True
)
app.add_typer(apikey_app, name="apikey")


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
