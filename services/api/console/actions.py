"""The console's dead-letter and replay actions, as thin calls into the library.

Every change goes through :mod:`exportcore.replays`, the same code as the admin API
(``/v1/admin/replays``, ``/v1/admin/dead-letters``): one replay per failed job, the same
admission control and outbox path, and the dead letter's state (``open`` → ``replayed`` |
``resolved``, with who and when) written in the same transaction. The operator is recorded
with :attr:`exportcore.auth.AuthContext.actor`, as the admin API records it.
"""

from __future__ import annotations

import logging
from uuid import UUID

from psycopg_pool import ConnectionPool

from exportcore.db import Conn, Row
from exportcore.replays import (
    BulkReplay,
    DeadLetterNotFound,
    DeadLetterResolved,
    replay_dead_letters,
    replay_export,
)
from exportcore.replays import resolve_dead_letter as _resolve
from exportcore.settings import Settings

log = logging.getLogger(__name__)

BULK_LIMIT = 1000
"""Most dead letters one bulk replay from the console replays; the rest stay open."""


def replay_once(
    pool: ConnectionPool[Conn], settings: Settings, *, job_id: UUID, actor: str
) -> Row | None:
    """Replay the failed job ``job_id`` unless it already has a replay: returns the new job,
    or None when a replay existed (made by anyone, even concurrently; see
    :func:`exportcore.replays.replay_export`). Raises what ``replay_export`` raises
    (``AdmissionRefused``, ``JobNotFound``, ``JobStateConflict``)."""
    replayed = replay_export(pool, settings, original_id=job_id, actor=actor)
    return replayed.job if replayed.created else None


def replay_reason(
    pool: ConnectionPool[Conn], settings: Settings, *, reason: str, actor: str
) -> BulkReplay:
    """Replay every ``open`` dead letter of ``reason`` (at most :data:`BULK_LIMIT`), oldest
    first; idempotent, stops at the first admission refusal
    (:func:`exportcore.replays.replay_dead_letters`)."""
    return replay_dead_letters(pool, settings, reason=reason, actor=actor, limit=BULK_LIMIT)


def resolve_dead_letter(
    pool: ConnectionPool[Conn], *, dead_letter_id: int, actor: str, note: str = ""
) -> bool:
    """Mark a dead letter ``resolved`` by ``actor`` (optional ``note``, at most 500
    characters); False when it is unknown or already resolved."""
    try:
        _resolve(pool, dead_letter_id=dead_letter_id, actor=actor, note=note[:500] or None)
    except (DeadLetterNotFound, DeadLetterResolved):
        log.info("console dead letter not resolved", extra={"dead_letter_id": dead_letter_id})
        return False
    return True
