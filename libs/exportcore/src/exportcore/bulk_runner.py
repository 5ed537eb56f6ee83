"""The bulk runner: the durable process that runs bulk actions (docs/operations.md, "Bulk
actions"; docs/architecture.md, "Processes").

A bulk action changes users' assets (it cancels or replays their exports), so it must not
live in the request process (lesson 03): the api only writes it (state ``running``, with its
audit row) and answers 202. This :class:`~exportcore.service.Service` runs in a thread of
the recovery-scanner, on its own :class:`~exportcore.service.ServiceLoop`:

- ``run_once`` claims the oldest run nobody holds (a new one, or one whose runner died:
  its lease expired) with ``bulk_action_claim_next`` — one UPDATE over a
  ``FOR UPDATE SKIP LOCKED`` pick that writes a new lease token and expiry, so two
  scanners never run one action at once — and runs it batch after batch to its end
  (:func:`exportcore.bulk.run_claimed`), each batch renewing the lease (``BULK_LEASE_SECONDS``)
  in the batch's own transaction. A runner that dies mid-run leaves its lease to expire;
  the next claim (this scanner's or another's) takes the run on from its last committed
  batch. On TERM the runner hands its run back between two batches (the lease ends at
  once), so a rolling restart delays a run by one batch, not by a lease.
- ``idle`` waits on LISTEN ``bulk_actions`` (sent by the start at COMMIT, and by an
  operator's resume) with the scanner's interval as the poll fallback, so a new run starts
  within milliseconds of its 202, and within one interval when the LISTEN connection is
  lost.
"""

from __future__ import annotations

import logging
import threading
import time
from uuid import uuid4

import psycopg
from psycopg_pool import ConnectionPool

from exportcore import bulk
from exportcore.db import Conn, connect
from exportcore.settings import Settings
from exportcore.store import bulk_actions as bulk_store

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "bulk_actions"
"""The channel a bulk action's start (and an operator's resume) notifies at COMMIT."""


class BulkRunner:
    """Claims and runs unfinished bulk actions; ``run_once()`` runs at most one to its end
    (or until ``stop`` is set: it is handed back between two batches) and returns
    ``{"bulk_runs": 0 | 1, "bulk_targets": targets seen by this pass}``."""

    name = "bulk-runner"

    def __init__(
        self,
        settings: Settings,
        pool: ConnectionPool[Conn],
        *,
        stop: threading.Event | None = None,
        batch_size: int = bulk.BATCH_SIZE,
        lease_seconds: float | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.stop = stop or threading.Event()
        self.batch_size = batch_size
        self.lease_seconds = lease_seconds or settings.bulk_lease_seconds
        self._listen: Conn | None = None
        self._listen_lost = False

    def run_once(self) -> dict[str, int]:
        """Claim the oldest run nobody holds and run it; ``{"bulk_runs": 0, ...}`` when
        there is none."""
        token = uuid4()
        with self.pool.connection() as conn:
            claimed = bulk_store.bulk_action_claim_next(
                conn, lease_token=token, lease_seconds=self.lease_seconds
            )
        if claimed is None:
            return {"bulk_runs": 0, "bulk_targets": 0}
        log.info(
            "bulk action claimed",
            extra={
                "bulk_id": claimed["id"],
                "kind": claimed["kind"],
                "seen": claimed["seen"],
                "confirmed": claimed["confirmed"],
                "resumed": claimed["batches"] > 0,
            },
        )
        ended = bulk.run_claimed(
            self.pool,
            self.settings,
            claimed,
            token,
            batch_size=self.batch_size,
            lease_seconds=self.lease_seconds,
            should_stop=self.stop.is_set,
        )
        return {"bulk_runs": 1, "bulk_targets": ended["seen"] - claimed["seen"]}

    def next_wait(self, counts: dict[str, int], interval: float) -> float:
        """0 after a run (another may be waiting), else ``interval``."""
        return 0.0 if counts.get("bulk_runs") else interval

    def idle(self, timeout: float, stop: threading.Event) -> None:
        """Wait for a NOTIFY on ``bulk_actions``, ``timeout`` or a stop. When LISTEN has
        just begun (first call, or the connection reopened after a loss) it returns at once:
        the next pass looks for runs written while nobody listened."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                fresh = self._listen is None or self._listen.closed
                conn = self._listen_conn()
                if fresh:
                    # LISTEN just began (the first idle, or back after a loss): a NOTIFY sent
                    # before it was heard by nobody, so look once more now
                    self._listen_lost = False
                    return
                for _ in conn.notifies(timeout=min(remaining, 0.5), stop_after=1):
                    return
            except psycopg.Error as exc:
                if not self._listen_lost:
                    log.warning(
                        "bulk runner LISTEN connection lost; polling",
                        extra={"error": type(exc).__name__},
                    )
                self._listen_lost = True
                self.close()
                stop.wait(min(remaining, 1.0))

    def _listen_conn(self) -> Conn:
        if self._listen is None or self._listen.closed:
            # its own session (DATABASE_DIRECT_URL behind a pooler): a LISTEN lasts as long
            # as its session, on the primary
            conn = connect(
                self.settings, "exports-bulk-runner-listen", autocommit=True, direct=True
            )
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self._listen = conn
        return self._listen

    @property
    def listening(self) -> bool:
        """True once LISTEN ``bulk_actions`` is in place (a start's NOTIFY is heard)."""
        return self._listen is not None and not self._listen.closed

    def close(self) -> None:
        """Close the LISTEN connection (reopened when needed)."""
        if self._listen is not None:
            try:
                self._listen.close()
            finally:
                self._listen = None
