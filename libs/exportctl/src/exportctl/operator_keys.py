"""``exportctl operator-key create | list | revoke``: operator keys, the cross-tenant
``/v1/admin`` and console access (database: ``DATABASE_URL``; a key is shown once and stored
only as a hash)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from exportcore.auth import create_operator_key
from exportcore.db import Row
from exportcore.store import operator_keys as operator_store
from exportctl.common import (
    AsJson,
    add_row,
    app,
    db_pool,
    err,
    fail,
    id_column,
    key_column,
    print_rows,
    revoke_key,
    safe,
    when,
)

operator_key_app = typer.Typer(
    help="Operator keys: cross-tenant /v1/admin access (database access; shown once).",
    no_args_is_help=True,
)
app.add_typer(operator_key_app, name="operator-key")


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
