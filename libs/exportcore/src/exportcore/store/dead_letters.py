"""Dead letters (``sql/dead_letters.sql``): failed jobs that need a person, and their state
(``open`` → ``replayed`` | ``resolved``)."""

from __future__ import annotations

from uuid import UUID

from exportcore.db import Conn, Row
from exportcore.sql import q

DEAD_LETTER_STATES = ("open", "replayed", "resolved")


def dead_letters_page(
    conn: Conn,
    *,
    limit: int,
    before: int | None = None,
    reason: str | None = None,
    state: str | None = None,
    tenant_id: str | None = None,
) -> list[Row]:
    """Up to ``limit`` dead letters with id < ``before`` (newest first), filtered by reason,
    state and tenant when given; each with its replay's status (``replay_status``)."""
    return conn.execute(
        q("dead_letters", "dead_letters_page"),
        {
            "limit": limit,
            "before": before,
            "reason": reason,
            "state": state,
            "tenant_id": tenant_id,
        },
    ).fetchall()


def dead_letter_get(conn: Conn, *, dead_letter_id: int) -> Row | None:
    """One dead letter (the columns of :func:`dead_letters_page`), or None."""
    return conn.execute(
        q("dead_letters", "dead_letter_get"), {"dead_letter_id": dead_letter_id}
    ).fetchone()


def dead_letter_resolve(
    conn: Conn, *, dead_letter_id: int, actor: str, note: str | None
) -> Row | None:
    """open | replayed → resolved by ``actor``; None when there is no such dead letter or
    it is already resolved."""
    return conn.execute(
        q("dead_letters", "dead_letter_resolve"),
        {"dead_letter_id": dead_letter_id, "actor": actor, "note": note},
    ).fetchone()


def dead_letter_mark_replayed(
    conn: Conn, *, job_id: UUID, replay_job_id: UUID, actor: str
) -> Row | None:
    """The dead letter of ``job_id`` → replayed by ``replay_job_id``; None when the job has
    no dead letter."""
    return conn.execute(
        q("dead_letters", "dead_letter_mark_replayed"),
        {"job_id": job_id, "replay_job_id": replay_job_id, "actor": actor},
    ).fetchone()


def dead_letters_open_for_reason(
    conn: Conn, *, reason: str, limit: int, after: int = 0, tenant_id: str | None = None
) -> list[Row]:
    """Up to ``limit`` open dead letters with ``reason`` (and tenant), oldest first, with
    id > ``after``: ``id``, ``job_id``, ``tenant_id``."""
    return conn.execute(
        q("dead_letters", "dead_letters_open_for_reason"),
        {"reason": reason, "limit": limit, "after": after, "tenant_id": tenant_id},
    ).fetchall()
