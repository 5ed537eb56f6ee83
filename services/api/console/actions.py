"""The console's dead-letter actions: bulk replay of one reason and "mark resolved".

Both call library functions: every replay goes through :func:`exportcore.replays.replay_export`
(the same admission control and outbox path as the admin API); the bookkeeping reads and
writes through :mod:`exportcore.store.console` (``sql/console.sql``). They are the only
place the console changes dead letters, so that the routes stay thin.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from uuid import UUID

from psycopg_pool import ConnectionPool

from exportcore.admission import AdmissionRefused
from exportcore.db import Conn, Row
from exportcore.domain import ExportError
from exportcore.replays import replay_export
from exportcore.settings import Settings
from exportcore.store import console as console_store

log = logging.getLogger(__name__)

BATCH = 100


@dataclass
class BulkReplay:
    """What a bulk replay of one reason did: ``replayed`` new job ids, how many dead letters
    were ``skipped`` (replayed meanwhile by someone else), and whether admission control
    stopped it (``refused``: the detail; the rest stay open for a later run)."""

    reason: str
    replayed: list[UUID] = field(default_factory=list)
    skipped: int = 0
    refused: str | None = None
    failed: list[str] = field(default_factory=list)


def replay_once(pool: ConnectionPool[Conn], settings: Settings, *, job_id: UUID) -> Row | None:
    """Replay the failed job ``job_id`` unless it already has a replay: returns the new job,
    or None when a replay existed (made by anyone, even concurrently).

    Replays of one job are serialised by a transaction-scoped advisory lock held while
    :func:`exportcore.replays.replay_export` runs, so two operators (or two bulk replays)
    racing on the same dead letter create one job. Raises what ``replay_export`` raises.
    """
    replayed = replay_export(pool, settings, original_id=job_id)
    return replayed.job if replayed.created else None


def replay_reason(
    pool: ConnectionPool[Conn], settings: Settings, *, reason: str, by: str, limit: int = 1000
) -> BulkReplay:
    """Replay every open dead letter (neither replayed nor resolved) of ``reason``, oldest
    first, at most ``limit``. Idempotent: a dead letter that has a replay is never replayed
    again, so running it twice (or twice at once) replays each dead letter once. Stops at
    the first admission refusal (over capacity or a tenant's quota), leaving the rest open.
    """
    out = BulkReplay(reason=reason)
    after: int | None = None
    while len(out.replayed) + out.skipped < limit:
        with pool.connection() as conn:
            batch = console_store.open_dead_letters_of_reason(
                conn, reason=reason, after=after, limit=min(BATCH, limit)
            )
        if not batch:
            break
        for dead in batch:
            after = dead["id"]
            try:
                job = replay_once(pool, settings, job_id=dead["job_id"])
            except AdmissionRefused as exc:
                out.refused = exc.detail
                break
            except ExportError as exc:  # e.g. the job is no longer failed
                out.failed.append(f"{dead['job_id']}: {exc.detail}")
                continue
            if job is None:
                out.skipped += 1
            else:
                out.replayed.append(job["id"])
        if out.refused:
            break
    log.info(
        "console bulk replay",
        extra={
            "reason": reason,
            "operator": by,
            "replayed": len(out.replayed),
            "skipped": out.skipped,
            "refused": bool(out.refused),
        },
    )
    return out


def resolve_dead_letter(
    pool: ConnectionPool[Conn], *, dead_letter_id: int, by: str, note: str = ""
) -> bool:
    """Mark an open dead letter resolved by operator ``by`` (with an optional ``note``, at
    most 500 characters); False when it is unknown, already resolved or was replayed."""
    with pool.connection() as conn:
        row = console_store.dead_letter_resolve(
            conn, dead_letter_id=dead_letter_id, resolved_by=by, note=note
        )
    log.info(
        "console dead letter resolved" if row else "console dead letter not resolved",
        extra={"dead_letter_id": dead_letter_id, "operator": by},
    )
    return row is not None
