"""``exportctl migrate``: the Alembic migrations on ``DATABASE_URL``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from exportctl.common import app, err, fail, load_settings, safe


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
        raise fail(f"{config} not found; run from the project root or pass --config", 2)
    cfg = Config(str(config))
    try:
        if downgrade:
            command.downgrade(cfg, revision)
        else:
            command.upgrade(cfg, revision)
    except Exception as exc:
        raise fail(f"migration failed: {type(exc).__name__}: {exc}") from None
    err.print(f"[green]database {'downgraded' if downgrade else 'upgraded'} to {safe(revision)}")
