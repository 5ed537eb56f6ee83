"""Outbox transitions (``sql/outbox.sql``): claim a batch, mark it sent (by the publisher or
by the worker's claim that delivered it), release."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from exportcore.db import Conn, Row
from exportcore.sql import q


@dataclass(frozen=True)
class Pass:
    """What ``outbox_mark_sent_and_claim_due`` did: the events claimed (each with ``id``,
    ``job_id``, ``tenant_id``, ``queue``, ``reason``, ``publish_attempts``,
    ``trace_context`` and ``claimed_at``, the claim's database time), how many earlier
    sends were marked sent, the seconds until the next other pending event is claimable
    (None: nothing pending), the (tenant, queue) pairs whose due events their cap held back
    (``held``), the due ``exports.fast`` events within their caps that ``fast_limit`` left
    pending (``fast_left``), and the events of jobs that had already ended, deleted instead
    of claimed (``dropped``)."""

    events: list[Row]
    marked: int
    next_due_in: float | None
    held: int = 0
    fast_left: int = 0
    dropped: int = 0


@dataclass(frozen=True)
class Sent:
    """One event a publisher sent and has not seen marked yet: its id, the claim token the
    publisher owns it with, and the claim's database time (when its dispatch began)."""

    id: UUID
    token: UUID
    dispatched_at: datetime


def _sent_params(sent: Sequence[Sent]) -> dict[str, Any]:
    return {
        "sent_ids": [s.id for s in sent],
        "sent_tokens": [s.token for s in sent],
        "dispatched_ats": [s.dispatched_at for s in sent],
    }


ASYNC_COMMIT = "SELECT set_config('synchronous_commit', 'off', true)"
"""Commit the rest of the transaction without waiting for its WAL flush: only the
publisher's pass and the worker's claim, whose loss in a crash is harmless
(docs/architecture.md, "Commits a crash may lose"; ``CLAIMS_SYNCHRONOUS_COMMIT``)."""


def outbox_claim_lock(conn: Conn) -> None:
    """Take the transaction-scoped lock that serialises the claims of due events (publishers'
    passes and workers' claims; inside a transaction, released at its COMMIT)."""
    conn.execute(q("outbox", "outbox_claim_lock"))


def claim_params(
    *,
    claim_token: UUID,
    limit: int,
    claim_seconds: float,
    bulk_cap: int,
    fast_cap: int,
    sent: Sequence[Sent] = (),
    fast_limit: int | None = None,
    held_queues: Sequence[str] = (),
) -> dict[str, Any]:
    """The parameters of ``outbox_mark_sent_and_claim_due`` (see
    :func:`outbox_mark_sent_and_claim_due`; also sent by the worker's claim, which runs the
    statement in its own pipeline: :mod:`exportcore.claims`)."""
    return {
        **_sent_params(sent),
        "claim_token": claim_token,
        "limit": limit,
        "fast_limit": fast_limit,
        "claim_seconds": claim_seconds,
        "bulk_cap": bulk_cap,
        "fast_cap": fast_cap,
        "held_queues": list(held_queues),
    }


def read_pass(rows: Sequence[Row]) -> Pass:
    """A :class:`Pass` from the rows of ``outbox_mark_sent_and_claim_due``."""
    if not rows:
        return Pass([], 0, None)
    first = rows[0]
    due = first["next_due_in"]
    return Pass(
        [r for r in rows if r["id"] is not None],
        int(first["marked"]),
        None if due is None else float(due),
        int(first["held"]),
        int(first["fast_left"]),
        int(first["dropped"]),
    )


def outbox_mark_sent_and_claim_due(
    conn: Conn, *, asynchronous_commit: bool = False, **kwargs: Any
) -> Pass:
    """Mark the earlier sends ``sent`` that no worker marked yet, and claim up to ``limit``
    due events (of ``exports.fast`` at most ``fast_limit``; None: ``limit``) for
    ``claim_seconds`` with ``claim_token``, fairly: per (tenant, queue) at most its in-flight
    cap (the tenant's override, else ``bulk_cap`` / ``fast_cap`` jobs) minus its jobs in
    flight, round robin across tenants (docs/architecture.md INV-16). Events of
    ``held_queues`` are left alone; events whose job has ended are deleted, never claimed.
    The keyword arguments are those of :func:`claim_params`.

    The claim runs after ``outbox_claim_lock`` in one transaction, sent in one pipeline
    (one round trip to the server, one commit): claims are serialised, so a cap holds with
    several publishers and workers. With ``asynchronous_commit`` the commit does not wait
    for its WAL flush (:data:`ASYNC_COMMIT`)."""
    params = claim_params(**kwargs)
    with conn.pipeline(), conn.transaction():
        if asynchronous_commit:
            conn.execute(ASYNC_COMMIT)
        outbox_claim_lock(conn)
        cur = conn.execute(q("outbox", "outbox_mark_sent_and_claim_due"), params)
    return read_pass(cur.fetchall())


@dataclass(frozen=True)
class Marked:
    """What ``outbox_mark_sent_many`` did: how many events were still owned and marked, and
    the seconds until the next other pending event is claimable (None: nothing pending)."""

    marked: int
    next_due_in: float | None


def outbox_mark_sent_many(conn: Conn, *, sent: Sequence[Sent]) -> Marked:
    """Mark the still-owned, still-unsent events of ``sent`` sent, stamp their jobs'
    dispatch and write their ``dispatched`` events dated each one's ``dispatched_at``; one
    statement for the whole batch."""
    row = conn.execute(q("outbox", "outbox_mark_sent_many"), _sent_params(sent)).fetchone()
    assert row is not None
    due = row["next_due_in"]
    return Marked(int(row["marked"]), None if due is None else float(due))


def mark_delivered_params(
    *, message_ids: Sequence[UUID | None], take_token: UUID | None, carrier: UUID | None
) -> dict[str, Any]:
    """The parameters of ``outbox_mark_delivered`` (see :func:`outbox_mark_delivered`)."""
    return {"message_ids": list(message_ids), "take_token": take_token, "carrier": carrier}


def outbox_mark_delivered(
    conn: Conn,
    *,
    message_ids: Sequence[UUID | None],
    take_token: UUID | None,
    carrier: UUID | None,
) -> int:
    """A worker's claim marks the still-unsent events it delivers sent: those of the message
    it received (``message_ids``) and those it took itself (``take_token``), and NOTIFYs
    ``claimed:<carrier>`` when ``carrier`` (the message's task id) is given. Returns how many
    events it marked. Run by :mod:`exportcore.claims` inside the claim's transaction."""
    row = conn.execute(
        q("outbox", "outbox_mark_delivered"),
        mark_delivered_params(message_ids=message_ids, take_token=take_token, carrier=carrier),
    ).fetchone()
    assert row is not None
    return int(row["delivered"])


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
