"""The console's dead-letter and replay actions, as thin calls into the library.

Every change goes through :mod:`exportcore.replays`, the same code as the admin API
(``/v1/admin/exports/{id}/replay``, ``/v1/admin/dead-letters``): one replay per failed job,
the same admission control and outbox path, and the dead letter's state (``open`` →
``replayed`` | ``resolved``, with who and when) written in the same transaction as its audit
row. The operator is recorded as :attr:`services.api.console.sessions.Operator.actor`, as the
admin API records its caller. Bulk replays are bulk actions (:mod:`exportcore.bulk`,
``services/api/console/bulk.py``).
"""

from __future__ import annotations

import logging
from uuid import UUID

from psycopg_pool import ConnectionPool

from exportcore.audit import Actor
from exportcore.db import Conn, Row
from exportcore.replays import DeadLetterNotFound, DeadLetterResolved, replay_export
from exportcore.replays import resolve_dead_letter as _resolve
from exportcore.settings import Settings

log = logging.getLogger(__name__)


def replay_once(
    pool: ConnectionPool[Conn], settings: Settings, *, job_id: UUID, actor: Actor
) -> Row | None:
    """Replay the failed job ``job_id`` unless it already has a replay: returns the new job,
    or None when a replay existed (made by anyone, even concurrently; see
    :func:`exportcore.replays.replay_export`). Raises what ``replay_export`` raises
    (``AdmissionRefused``, ``JobNotFound``, ``JobStateConflict``)."""
    replayed = replay_export(pool, settings, original_id=job_id, actor=actor)
    return replayed.job if replayed.created else None


def resolve_dead_letter(
    pool: ConnectionPool[Conn], *, dead_letter_id: int, actor: Actor, note: str = ""
) -> bool:
    """Mark a dead letter ``resolved`` by ``actor`` (optional ``note``, at most 500
    characters); False when it is unknown or already resolved."""
    try:
        _resolve(pool, dead_letter_id=dead_letter_id, actor=actor, note=note[:500] or None)
    except (DeadLetterNotFound, DeadLetterResolved):
        log.info("console dead letter not resolved", extra={"dead_letter_id": dead_letter_id})
        return False
    return True
