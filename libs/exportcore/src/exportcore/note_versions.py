"""Pruning of the note version store (``note_versions``), a hygiene task of the
recovery-scanner (docs/architecture.md INV-18 snapshot-by-reference).

The note triggers copy every superseded note version into ``note_versions``
unconditionally; a version can go once no job that may still render names it AND no
transaction that may still commit a reference to it is in progress. The second half is a
grace period, in two steps one hygiene pass apart:

1. **mark**: read (one statement, one snapshot) at most ``limit`` versions no queued,
   running or failed job names; then, in a later statement, every transaction in progress
   in the database, identified by (backend pid, transaction start).
2. **sweep** (a later pass): when none of those transactions is still in progress and no
   prepared transaction exists, delete the marked versions that are still named by no such
   job (read again: what the waited-for transactions committed is visible now).

A transaction that could still reference a marked version read it (or the items of a job
that named it) in a snapshot taken before the mark's, so it was in progress at the mark;
once it has ended, its reference (if it committed one) is visible to the sweep. The marks
live in this object only: a restarted scanner marks again, nothing is lost.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from psycopg_pool import ConnectionPool

from exportcore.db import Conn
from exportcore.store import notes as note_store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mark:
    """Step 1's result: candidate versions ``(note_id, version)`` and the transactions
    ``(pid, xact_start)`` in progress right after they were read."""

    versions: list[tuple[int, int]]
    transactions: list[tuple[int, datetime]]


class VersionPruner:
    """Prunes ``note_versions`` in bounded batches; :meth:`run_once` returns how many
    versions it deleted (0 while it waits for a grace period to end)."""

    def __init__(self, pool: ConnectionPool[Conn], limit: int) -> None:
        self.pool = pool
        self.limit = limit
        self.mark: Mark | None = None

    def run_once(self) -> int:
        """Sweep the previous mark if its grace period has ended, then mark the next batch
        (when nothing is marked). Returns the versions deleted."""
        deleted = 0
        with self.pool.connection() as conn:
            if self.mark is not None:
                waiting, prepared = note_store.note_versions_prune_waiting(
                    conn, transactions=self.mark.transactions
                )
                if waiting or prepared:
                    log.debug(
                        "note versions: grace period not over",
                        extra={"waiting": waiting, "prepared": prepared},
                    )
                    return 0
                deleted = note_store.note_versions_prune_sweep(conn, versions=self.mark.versions)
                self.mark = None
            versions = note_store.note_versions_prune_mark(conn, limit=self.limit)
            if versions:
                self.mark = Mark(versions, note_store.note_versions_prune_in_progress(conn))
        return deleted
