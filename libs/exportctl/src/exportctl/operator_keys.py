"""``exportctl operator-key create | list | revoke``: operator keys, the cross-tenant
``/v1/admin`` and console access (database: ``DATABASE_URL``; a key is shown once and stored
only as a hash)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from exportcore import audit
from exportcore.audit import Actor
from exportcore.auth import ROLES, create_operator_key, validate_role
from exportcore.db import Conn, Row
from exportcore.store import operator_keys as operator_store
from exportctl.common import app, completes, db_pool, err, fail, revoke_key, safe, when
from exportctl.exits import EXIT_NOT_FOUND
from exportctl.output import AsJson, OutputOpt, emit_new_key, emit_rows, explicit, mode
from exportctl.tables import Col, fit

operator_key_app = typer.Typer(
    help="Operator keys: cross-tenant /v1/admin access (database access; shown once).",
    no_args_is_help=True,
)
app.add_typer(operator_key_app, name="operator-key")


def _audit_key(conn: Conn, action: str, row: Row, **detail: object) -> None:
    """The audit row of a key change made with database access (who: the OS user)."""
    audit.record(
        conn,
        Actor.database(),
        action,
        target_kind="operator_key",
        target_id=row["id"],
        detail={"prefix": row["prefix"], "label": row["label"], "role": row["role"], **detail},
    )


@operator_key_app.command("create")
def operator_key_create(
    label: Annotated[str, typer.Option(help="who holds the key (recorded on what it does)")],
    role: Annotated[
        str,
        typer.Option(
            help="viewer (reads everything, changes nothing) | admin (every operator action)",
            autocompletion=completes(*ROLES),
        ),
    ] = "admin",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no message on stderr")] = False,
    output: OutputOpt = None,
) -> None:
    """Create an operator key (cross-tenant /v1/admin and the console) with a role; printed
    once, stored hashed. Audited."""
    with db_pool() as pool, pool.connection() as conn, conn.transaction():
        try:
            key, row = create_operator_key(conn, label=label, role=role)
        except ValueError as exc:
            raise fail(str(exc), 2) from None
        _audit_key(conn, "operator_key_create", row)
    summary = (
        f"operator key [bold]{safe(row['prefix'])}…[/] for {safe(row['label'])} "
        f"({safe(row['role'])})"
    )
    emit_new_key(key, row, summary, quiet=quiet, how=explicit(output))


@operator_key_app.command("list")
def operator_key_list(
    output: OutputOpt = None,
    as_json: AsJson = False,
) -> None:
    """Operator keys with their role and state (never the keys themselves)."""
    with db_pool() as pool, pool.connection() as conn:
        rows = operator_store.operator_key_list(conn)
    emit_rows(rows, mode(output, as_json), operator_key_table, empty="no operator keys")


def operator_key_table(rows: list[Row]) -> Table:
    """Operator key rows (``operator_key_list``), fitted to the terminal: the prefix (what
    ``revoke`` and ``set-role`` take), the label and the role always."""
    return fit(
        [
            Col("prefix", lambda r: r["prefix"]),
            Col("label", lambda r: r["label"], fold=True),
            Col("role", lambda r: r.get("role", "")),
            Col("revoked", lambda r: when(r["revoked_at"]), priority=1),
            Col("created", lambda r: when(r["created_at"]), priority=2),
            Col("id", lambda r: r["id"], priority=3),
        ],
        rows,
    )


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
        audited=lambda conn, row: _audit_key(conn, "operator_key_revoke", row),
    )
    err.print(
        f"revoked operator key {safe(row['prefix'])}… ({safe(row['id'])}, {safe(row['label'])})"
    )


@operator_key_app.command("set-role")
def operator_key_set_role(
    key: Annotated[str, typer.Argument(help="the key's id, or its prefix (nex_op_xxxxxxxx)")],
    role: Annotated[str, typer.Argument(help="viewer | admin", autocompletion=completes(*ROLES))],
) -> None:
    """Change an operator key's role; its console sessions and API calls use the new role
    from their next request. Audited."""
    try:
        checked = validate_role(role)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    with db_pool() as pool, pool.connection() as conn, conn.transaction():
        changed = operator_store.operator_key_set_role(conn, key=key, role=checked)
        if changed:
            _audit_key(conn, "operator_key_set_role", changed[0])
    if not changed:
        raise fail(
            f"no single active operator key {key!r}; `exportctl operator-key list` shows them",
            EXIT_NOT_FOUND,
        )
    row = changed[0]
    err.print(f"operator key {safe(row['prefix'])}… ({safe(row['label'])}) is now {safe(role)}")
