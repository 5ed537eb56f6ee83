"""A job's deadline on this worker's clock, and I/O bounded by the time left to it.

A job must not outlive ``deadline_at`` (docs/architecture.md INV-8 retries-are-bounded:
the deadline is the limit). Checking it between steps is not enough: one storage or
database call started a second before the deadline, with its usual timeouts (an S3 read
timeout of 60 s, three attempts; a statement timeout of 15 s), would run on well past it.
So every I/O call made on behalf of a running job gets a timeout of at most the time left
(the course's rule: each real I/O sets a timeout no larger than what remains):

- database: the statement timeout of a snapshot read is lowered to the time left when that
  is below ``DB_STATEMENT_TIMEOUT_MS`` (:func:`statement_timeout`), and restored after;
- object storage: a call near the deadline goes through a client whose connect and read
  timeouts are at most the time left, with one attempt
  (:meth:`exportcore.artifacts.s3.S3ArtifactStore.client`);
- files: a write or fsync is not started once the deadline has passed (a blocking system
  call itself cannot be interrupted; local disks answer in milliseconds).

Past the deadline, :meth:`Deadline.bound` raises :class:`DeadlineExceeded`, a transient
error whose retry policy then finds no time left and fails the job with
``deadline_exceeded`` (a dead letter), as the lease renewal's deadline check would a moment
later.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from exportcore.failures import TransientError


class DeadlineExceeded(TransientError):
    """The job's deadline passed (or too little of it is left) before an I/O call; code
    ``deadline_exceeded``."""

    def __init__(self, detail: str) -> None:
        super().__init__("deadline_exceeded", detail)


@dataclass(frozen=True)
class Deadline:
    """The instant ``at`` (``clock()`` seconds, monotonic) by which a job must be done."""

    at: float
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)

    @classmethod
    def after(cls, seconds: float, clock: Callable[[], float] = time.monotonic) -> Deadline:
        """The deadline ``seconds`` from now (a job's ``seconds_to_deadline``, read from the
        database clock at its claim)."""
        return cls(clock() + seconds, clock)

    def remaining(self) -> float:
        """Seconds left (negative once passed)."""
        return self.at - self.clock()

    def bound(self, timeout: float, what: str, least: float = 0.0) -> float:
        """``timeout`` (seconds) capped at the time left. Raises :class:`DeadlineExceeded`
        when no more than ``least`` seconds are left (``what`` names the call)."""
        left = self.remaining()
        if left <= least:
            raise DeadlineExceeded(f"the deadline passed before {what}")
        return min(timeout, left)

    def check(self, what: str) -> None:
        """Raise :class:`DeadlineExceeded` when the deadline has passed."""
        self.bound(math.inf, what)


@contextmanager
def statement_timeout(conn: Any, deadline: Deadline | None, default_ms: int) -> Iterator[None]:
    """Run the block's statements on ``conn`` (autocommit) with a statement timeout of at
    most the time left to ``deadline``: when that is below ``default_ms``
    (``DB_STATEMENT_TIMEOUT_MS``, 0 = none) the block runs in one transaction that sets
    it with ``SET LOCAL`` semantics (``set_config(…, true)``: it ends with the transaction,
    so behind a transaction pooler it never stays on a server connection another client
    gets next); otherwise nothing is sent, so a job far from its deadline pays nothing. A
    statement cancelled by it raises ``psycopg.errors.QueryCanceled``. Raises
    :class:`DeadlineExceeded` when the deadline has already passed."""
    if deadline is None:
        yield
        return
    left_ms = math.floor(deadline.bound(math.inf, "a database read") * 1000)
    if default_ms and left_ms >= default_ms:
        yield
        return
    with conn.transaction():
        conn.execute("SELECT set_config('statement_timeout', %s, true)", (str(max(1, left_ms)),))
        yield
