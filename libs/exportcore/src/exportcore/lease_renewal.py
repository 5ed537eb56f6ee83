"""Lease renewal: a worker keeps the lease of each job it renders for as long as it may hold it.

A claimed job's lease (``lease_token``, ``lease_expires_at``) is renewed whenever a third of
it has passed: between chunks by the renderer, and by one renewal thread per process while a
single chunk takes long. A refused renewal (another token took the job, a cancel was
requested, the deadline passed) marks the lease lost; the runner stops without publishing.
While renewals succeed, recovery leaves the job alone (docs/architecture.md INV-15
valid-lease-is-kept); each renewal is ``job_renew_lease`` (``sql/jobs.sql``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from uuid import UUID

import psycopg
from opentelemetry import context as otel_context
from psycopg_pool import ConnectionPool

from exportcore import telemetry
from exportcore.db import Conn
from exportcore.store import jobs as job_store

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """The worker no longer holds the job's lease (expired, taken over, cancelled, or past
    its deadline); it must stop and never publish."""


class LeaseKeeper:
    """Keeps a lease while a job renders.

    The lease is renewed whenever a third of it has passed since the last renewal: between
    chunks by :meth:`check`, and by the process's renewal thread while one chunk takes long.
    A refused renewal (token lost, cancel requested, deadline passed) marks the lease lost;
    the next :meth:`check` raises ``LeaseLost``. ``clock`` returns monotonic seconds;
    ``trace_context`` is the job's claim span, the parent of its renewal spans.
    """

    def __init__(
        self,
        pool: ConnectionPool[Conn],
        job_id: UUID,
        lease_token: UUID,
        lease_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        trace_context: otel_context.Context | None = None,
    ) -> None:
        self.pool = pool
        self.job_id = job_id
        self.lease_token = lease_token
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.renewed_at = clock()
        self.progress = 0
        self.lost: str | None = None
        # the job's claim span (else the current context): renewals from the renewal thread
        # land in the job's own trace
        self._trace_context = trace_context or otel_context.get_current()
        self._lock = threading.Lock()

    def due(self) -> bool:
        """True when a third of the lease has passed since the last renewal."""
        return self.clock() - self.renewed_at >= self.lease_seconds / 3

    def renew(self) -> bool:
        """Renew now; False (and ``lost`` set) when the renewal was refused."""
        with self._lock:
            if self.lost:
                return False
            started = self.clock()
            token = otel_context.attach(self._trace_context)
            try:
                with (
                    telemetry.span(
                        "exports.renew_lease",
                        attributes={
                            "job_id": self.job_id,
                            "lease_token": self.lease_token,
                            "progress": self.progress,
                        },
                    ) as current,
                    self.pool.connection() as conn,
                ):
                    row = job_store.job_renew_lease(
                        conn,
                        job_id=self.job_id,
                        lease_token=self.lease_token,
                        lease_seconds=self.lease_seconds,
                        progress=self.progress,
                    )
                    current.set_attribute("renewed", row is not None)
            finally:
                otel_context.detach(token)
            if row is None:
                self.lost = f"lease {self.lease_token} of job {self.job_id} could not be renewed"
                return False
            self.renewed_at = started
            return True

    def check(self, progress: int) -> None:
        """Between chunks: record progress, renew if due; raises ``LeaseLost``."""
        self.progress = progress
        if self.lost or (self.due() and not self.renew()):
            raise LeaseLost(self.lost)

    def start(self) -> None:
        """Have the process's renewal thread renew this lease while a chunk takes long."""
        _RENEWAL_THREAD.add(self)

    def stop(self) -> None:
        """Stop renewing from the renewal thread (waits for a renewal in progress)."""
        _RENEWAL_THREAD.remove(self)
        with self._lock:  # a renewal started before removal has finished
            pass


class _RenewalThread:
    """One thread per process renews every registered lease that is due, so no thread is
    started per job. Re-created after ``fork`` (Celery prefork children)."""

    def __init__(self) -> None:
        self._keepers: set[LeaseKeeper] = set()
        self._lock = threading.Lock()
        self._pid: int | None = None

    def add(self, keeper: LeaseKeeper) -> None:
        with self._lock:
            self._keepers.add(keeper)
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="lease-renewal", daemon=True).start()

    def remove(self, keeper: LeaseKeeper) -> None:
        with self._lock:
            self._keepers.discard(keeper)

    def _run(self) -> None:
        while True:
            with self._lock:
                keepers = list(self._keepers)
            period = min((k.lease_seconds / 6 for k in keepers), default=0.5)
            time.sleep(max(0.05, min(period, 0.5)))
            for keeper in keepers:
                if keeper.lost or not keeper.due():
                    continue
                try:
                    keeper.renew()
                except psycopg.Error as exc:  # the next round tries again; expiry is the limit
                    log.warning(
                        "lease renewal failed",
                        extra={"job_id": str(keeper.job_id), "error": type(exc).__name__},
                    )


_RENEWAL_THREAD = _RenewalThread()
