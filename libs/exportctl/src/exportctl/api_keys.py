"""``exportctl apikey create | list | revoke``: tenants' API keys (database:
``DATABASE_URL``; a key is shown once at creation and stored only as a hash)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.table import Table

from exportcore import audit
from exportcore.audit import Actor
from exportcore.auth import DEFAULT_SCOPES, SCOPES, create_api_key
from exportcore.db import Conn, Row
from exportcore.store import api_keys as api_key_store
from exportcore.store import tenants as tenant_store
from exportctl.common import app, db_pool, err, fail, revoke_key, safe
from exportctl.exits import EXIT_NOT_FOUND
from exportctl.output import AsJson, OutputOpt, emit_new_key, emit_rows, explicit, mode
from exportctl.tables import Col, fit

apikey_app = typer.Typer(
    help="API keys (shown once at creation, stored hashed).", no_args_is_help=True
)
app.add_typer(apikey_app, name="apikey")


def _audit_key(conn: Conn, action: str, row: Row) -> None:
    """The audit row of a tenant key change made with database access (who: the OS user)."""
    audit.record(
        conn,
        Actor.database(),
        action,
        target_kind="api_key",
        target_id=row["id"],
        tenant_id=row["tenant_id"],
        detail={"prefix": row["prefix"], "label": row.get("label", "")},
    )


@apikey_app.command("create")
def apikey_create(
    tenant_id: Annotated[str, typer.Argument(help="the tenant the key acts for")],
    scope: Annotated[
        list[str] | None, typer.Option("--scope", help=f"repeatable; one of {', '.join(SCOPES)}")
    ] = None,
    label: Annotated[str, typer.Option(help="a note for operators")] = "",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no message on stderr")] = False,
    output: OutputOpt = None,
) -> None:
    """Create an API key; the key is printed once on stdout (with ``--output json``: the
    key's row with ``key``) and never stored. Audited."""
    scopes = list(scope or DEFAULT_SCOPES)
    with db_pool() as pool, pool.connection() as conn:
        if tenant_store.tenant_get(conn, tenant_id=tenant_id) is None:
            raise fail(
                f"no tenant {tenant_id!r}; create it with `exportctl tenant create {tenant_id}`",
                EXIT_NOT_FOUND,
            )
        try:
            with conn.transaction():
                key, row = create_api_key(conn, tenant_id=tenant_id, scopes=scopes, label=label)
                _audit_key(conn, "api_key_create", row)
        except ValueError as exc:
            raise fail(str(exc)) from None
    summary = (
        f"key [bold]{safe(row['prefix'])}…[/] for tenant {safe(tenant_id)}, "
        f"scopes {safe(', '.join(row['scopes']))}"
    )
    emit_new_key(key, row, summary, quiet=quiet, how=explicit(output))


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
        audited=lambda conn, row: _audit_key(conn, "api_key_revoke", row),
    )
    err.print(
        f"revoked {safe(row['prefix'])}… ({safe(row['id'])}) of tenant {safe(row['tenant_id'])}"
    )


@apikey_app.command("list")
def apikey_list(
    tenant: Annotated[str | None, typer.Option("--tenant", "-t", help="one tenant only")] = None,
    output: OutputOpt = None,
    as_json: AsJson = False,
) -> None:
    """Keys with their scopes and state (never the keys themselves)."""
    with db_pool() as pool, pool.connection() as conn:
        rows = api_key_store.api_key_list(conn, tenant_id=tenant)
    emit_rows(rows, mode(output, as_json), apikey_table, empty="no API keys")


def apikey_table(rows: Sequence[Row]) -> Table:
    """API key rows (``api_key_list``), fitted to the terminal: the prefix (what ``revoke``
    takes) and the tenant always; the id and the rest give way first."""

    def stamp(value: Any) -> str:
        return value.strftime("%Y-%m-%d %H:%M") if value else ""

    return fit(
        [
            Col("prefix", lambda r: r["prefix"]),
            Col("tenant", lambda r: r["tenant_id"]),
            Col("scopes", lambda r: ", ".join(r["scopes"]), priority=1),
            Col("revoked", lambda r: stamp(r["revoked_at"]), priority=2),
            Col("label", lambda r: r["label"], priority=3, fold=True),
            Col("created", lambda r: stamp(r["created_at"]), priority=4),
            Col("id", lambda r: r["id"], priority=5),
        ],
        rows,
    )
