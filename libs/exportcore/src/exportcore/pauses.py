"""Pausing and resuming dispatch: of a queue (``exports.fast`` / ``exports.bulk``), or of one
tenant on a queue.

An operator stops dispatch during a storage incident or after a bad release: the pause is
a row of ``dispatch_pauses`` (migration 0024), so it survives every process restart, and
the fair outbox claim (``outbox.sql`` ``outbox_mark_sent_and_claim_due``), which every
publisher pass and every worker's take of due jobs beside its message runs, leaves the
pending events of a paused (tenant, queue) pair unclaimed: paused work waits in the
outbox, as queued jobs. What was dispatched before the pause is not recalled: running
exports finish, and a message already in the broker (at most the pair's in-flight cap of
them) is still claimed. A resume deletes the row and NOTIFYs the publishers, which send the
waiting events at once. The job's deadline (``JOB_DEADLINE_SECONDS``) keeps running while it
waits: a pause longer than that fails the paused exports with ``deadline_exceeded``, which
is why a pause left on too long raises an alert (``DISPATCH_PAUSE_ALERT_SECONDS``).

Every pause and resume names who asked and why (a required reason) and is audited
(``queue_pause`` / ``queue_resume``, :mod:`exportcore.audit`) in its own transaction: the
audit row is there, or the change did not happen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from psycopg_pool import ConnectionPool

from exportcore import audit
from exportcore.audit import Actor
from exportcore.db import Conn, Row, transaction
from exportcore.domain import QUEUES, ExportError
from exportcore.store import dispatch_pauses as pause_store

log = logging.getLogger(__name__)

REASON_MAX = 500
"""The longest reason, in characters (the table's CHECK)."""


class AlreadyPaused(ExportError):
    """The scope (a queue, or a tenant on it) is paused already (``extra``: who paused it,
    when and why)."""

    code = "dispatch_already_paused"
    title = "Dispatch is already paused"
    kind = "conflict"


class NotPaused(ExportError):
    """The scope has no pause to resume (a tenant's pause and its queue's are separate)."""

    code = "dispatch_not_paused"
    title = "Dispatch is not paused"
    kind = "conflict"


class InvalidPause(ExportError):
    """An unknown queue, or a reason that is empty or too long."""

    code = "invalid_pause"
    title = "Invalid pause"
    kind = "invalid"


@dataclass(frozen=True)
class Scope:
    """What a pause covers: ``queue``, and ``tenant_id`` (None: every tenant of it)."""

    queue: str
    tenant_id: str | None = None

    @property
    def label(self) -> str:
        """How records name the scope: ``exports.bulk`` or ``exports.bulk/acme``."""
        return self.queue if self.tenant_id is None else f"{self.queue}/{self.tenant_id}"


def check(scope: Scope, reason: str) -> str:
    """The reason, stripped, once ``scope`` names a known queue and the reason has 1 to
    :data:`REASON_MAX` characters; raises :class:`InvalidPause` otherwise."""
    if scope.queue not in QUEUES:
        raise InvalidPause(f"queue is one of {', '.join(QUEUES)}, not {scope.queue!r}")
    text = reason.strip()
    if not 1 <= len(text) <= REASON_MAX:
        raise InvalidPause(f"give a reason of 1 to {REASON_MAX} characters (who reads it: audit)")
    return text


def pause(pool: ConnectionPool[Conn], scope: Scope, *, reason: str, actor: Actor) -> Row:
    """Pause dispatch of ``scope`` for ``reason`` by ``actor``; returns the pause
    (``queue``, ``tenant_id``, ``reason``, ``paused_by``, ``paused_at``). Audited as
    ``queue_pause`` in the same transaction; the next claim of any publisher or worker
    skips the scope. Raises :class:`InvalidPause`, or :class:`AlreadyPaused` naming who
    paused it, when and why."""
    text = check(scope, reason)
    with transaction(pool) as conn:
        row = pause_store.dispatch_pause_insert(
            conn,
            queue=scope.queue,
            tenant_id=scope.tenant_id,
            reason=text,
            paused_by=actor.name,
        )
        if row is not None:
            _audit(conn, actor, "queue_pause", scope, text)
        else:
            existing = pause_store.dispatch_pause_get(
                conn, queue=scope.queue, tenant_id=scope.tenant_id
            )
    if row is None:
        who = existing or {"paused_by": "someone", "paused_at": None, "reason": ""}
        since = who["paused_at"].isoformat() if who["paused_at"] is not None else None
        raise AlreadyPaused(
            f"dispatch of {scope.label} was paused by {who['paused_by']} at {since}: "
            f"{who['reason']}",
            paused_by=who["paused_by"],
            paused_at=since,
            reason=who["reason"],
        )
    log.info("dispatch paused", extra={"queue": scope.queue, "tenant_id": scope.tenant_id})
    return row


def resume(pool: ConnectionPool[Conn], scope: Scope, *, reason: str, actor: Actor) -> Row:
    """Lift the pause of exactly ``scope`` (a tenant's pause and its queue's are separate)
    for ``reason`` by ``actor``; returns the pause that ended, with ``resumed_at``. The
    publishers are woken at COMMIT and send the waiting events. Audited as
    ``queue_resume`` (with how long the pause lasted) in the same transaction. Raises
    :class:`InvalidPause`, or :class:`NotPaused` when the scope was not paused."""
    text = check(scope, reason)
    with transaction(pool) as conn:
        row = pause_store.dispatch_pause_delete(conn, queue=scope.queue, tenant_id=scope.tenant_id)
        if row is not None:
            lasted = (row["resumed_at"] - row["paused_at"]).total_seconds()
            _audit(conn, actor, "queue_resume", scope, text, paused_seconds=round(lasted, 3))
    if row is None:
        raise NotPaused(f"dispatch of {scope.label} is not paused")
    log.info("dispatch resumed", extra={"queue": scope.queue, "tenant_id": scope.tenant_id})
    return row


def pauses(pool: ConnectionPool[Conn]) -> list[Row]:
    """Every pause in force (see ``dispatch_pauses_list``): ``queue``, ``tenant_id``,
    ``reason``, ``paused_by``, ``paused_at``, ``paused_seconds``, ``waiting``."""
    with pool.connection() as conn:
        return pause_store.dispatch_pauses_list(conn)


def _audit(
    conn: Conn, actor: Actor, action: str, scope: Scope, reason: str, **detail: object
) -> None:
    audit.record(
        conn,
        actor,
        action,
        target_kind="queue",
        target_id=scope.label,
        tenant_id=scope.tenant_id,
        detail={"queue": scope.queue, "reason": reason, **detail},
    )
