"""Outbox transitions (``sql/outbox.sql``): claim a batch, mark it sent, release."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from exportcore.db import Conn, Row
from exportcore.sql import q


@dataclass(frozen=True)
class Pass:
    """What ``outbox_mark_sent_and_claim_due`` did: the events claimed (each with ``id``,
    ``job_id``, ``queue``, ``reason``, ``publish_attempts``, ``trace_context`` and
    ``claimed_at``, the claim's database time), how many events of the previous pass were
    marked sent, and the seconds until the next other pending event is claimable (None:
    nothing pending)."""

    events: list[Row]
    marked: int
    next_due_in: float | None
    held: int = 0


def outbox_claim_lock(conn: Conn) -> None:
    """Take the transaction-scoped lock that serialises the publishers' claims (inside a
    transaction; released at its COMMIT)."""
    conn.execute(q("outbox", "outbox_claim_lock"))


def outbox_mark_sent_and_claim_due(
    conn: Conn,
    *,
    claim_token: UUID,
    limit: int,
    claim_seconds: float,
    bulk_cap: int,
    fast_cap: int,
    sent_ids: Sequence[UUID] = (),
    sent_token: UUID | None = None,
    dispatched_at: datetime | None = None,
    held_queues: Sequence[str] = (),
) -> Pass:
    """Mark the previous pass's events sent (``sent_ids`` owned through ``sent_token``,
    dispatched at ``dispatched_at``) and claim up to ``limit`` due events for
    ``claim_seconds``, fairly: per (tenant, queue) at most its in-flight cap (the tenant's
    override, else ``bulk_cap`` / ``fast_cap`` jobs) minus its jobs in flight, round robin
    across tenants (docs/architecture.md INV-16). ``Pass.held`` counts the (tenant, queue)
    pairs whose due events were held back by their cap. Events of ``held_queues`` (the
    publisher's broker window) are left pending too, not counted in ``held``.

    The claim runs after ``outbox_claim_lock`` in one transaction, sent in one pipeline
    (one round trip to the server, one commit): publishers' claims are serialised, so a cap
    holds with several publishers."""
    with conn.pipeline(), conn.transaction():
        outbox_claim_lock(conn)
        cur = conn.execute(
            q("outbox", "outbox_mark_sent_and_claim_due"),
            {
                "sent_ids": list(sent_ids),
                "sent_token": sent_token,
                "dispatched_at": dispatched_at,
                "claim_token": claim_token,
                "limit": limit,
                "claim_seconds": claim_seconds,
                "bulk_cap": bulk_cap,
                "fast_cap": fast_cap,
                "held_queues": list(held_queues),
            },
        )
    rows = cur.fetchall()

    due = rows[0]["next_due_in"] if rows else None
    return Pass(
        [r for r in rows if r["id"] is not None],
        int(rows[0]["marked"]) if rows else 0,
        None if due is None else float(due),
        int(rows[0]["held"]) if rows else 0,
    )


@dataclass(frozen=True)
class Marked:
    """What ``outbox_mark_sent_many`` did: how many events were still owned and marked, and
    the seconds until the next other pending event is claimable (None: nothing pending)."""

    marked: int
    next_due_in: float | None


def outbox_mark_sent_many(
    conn: Conn, *, ids: Sequence[UUID], claim_token: UUID, dispatched_at: datetime
) -> Marked:
    """Mark the still-owned events sent, stamp their jobs' dispatch and write their
    ``dispatched`` events dated ``dispatched_at``; one statement for the whole batch."""
    row = conn.execute(
        q("outbox", "outbox_mark_sent_many"),
        {"sent_ids": list(ids), "sent_token": claim_token, "dispatched_at": dispatched_at},
    ).fetchone()
    assert row is not None
    due = row["next_due_in"]
    return Marked(int(row["marked"]), None if due is None else float(due))


def outbox_release_many(
    conn: Conn,
    *,
    ids: Sequence[UUID],
    claim_token: UUID,
    retry_seconds: Sequence[float],
    error: str,
) -> int:
    """Return unpublished events to the pending pool, each due again after its
    ``retry_seconds``; returns how many were still owned."""
    return conn.execute(
        q("outbox", "outbox_release_many"),
        {
            "ids": list(ids),
            "claim_token": claim_token,
            "retry_seconds": list(retry_seconds),
            "error": error[:500],
        },
    ).rowcount


def outbox_delete_sent_before(conn: Conn, *, retention_seconds: float, limit: int) -> int:
    """Delete outbox events sent more than ``retention_seconds`` ago; returns the count."""
    cur = conn.execute(
        q("outbox", "outbox_delete_sent_before"),
        {"retention_seconds": retention_seconds, "limit": limit},
    )
    return cur.rowcount
