"""Dead letters (``sql/dead_letters.sql``)."""

from __future__ import annotations

from exportcore.db import Conn, Row
from exportcore.sql import q


def dead_letters_page(
    conn: Conn, *, limit: int, before: int | None = None, reason: str | None = None
) -> list[Row]:
    """Up to ``limit`` dead letters with id < ``before`` (newest first), one reason or all."""
    return conn.execute(
        q("dead_letters", "dead_letters_page"),
        {"limit": limit, "before": before, "reason": reason},
    ).fetchall()
