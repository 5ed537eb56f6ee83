"""The settings a drill stack runs with, and the recovery budgets they imply.

Drills use short leases, scan intervals and thresholds so that every recovery path runs in
seconds. The service levels of docs/architecture.md are stated for the defaults (30 s leases,
5 s scans, 60 s dispatch threshold); a drill compares what it measured against the same
formulas evaluated with the settings it actually used.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from devtools.ha.postgres import TIMING

SCANNER_JITTER = 0.2  # exportcore.service.ServiceLoop: each pause is interval x [0.8, 1.2]
SCAN_PASS_ALLOWANCE = 0.5  # a scanner pass's own queries and commit, on a busy 2-core machine
# A failover's unavailable window once the leader key is free: the synchronous standby's HA
# loop takes the key and promotes itself, on_role_change repoints PgBouncer, the pools
# connect to the new primary and a client's next try is answered 202. Measured 0.5-2 s
# after the key was free (docs/drills.md), 3-7 s for a whole switchover: room for a loaded
# 2-core machine, and for the last 202 before the fault, where the window starts.
FAILOVER_ALLOWANCE_SECONDS = 8.0
FailoverKind = Literal["switchover", "kill", "crash"]


@dataclass(frozen=True)
class DrillSettings:
    """Settings of the stack under drill (passed to every process as environment)."""

    lease_seconds: float = 4.0
    # the recovery-scanner's bulk runner: a killed runner's bulk action is taken on after it
    bulk_lease_seconds: float = 4.0
    scanner_interval_seconds: float = 0.5
    retry_base_seconds: float = 0.2
    retry_cap_seconds: float = 1.0
    dispatch_threshold_seconds: float = 4.0
    dispatch_backoff_max_factor: int = 4
    max_attempts: int = 3
    publisher_poll_seconds: float = 0.25
    # the publisher marks a message no claim marked after a quarter of this: 0.5 s
    publisher_claim_seconds: float = 2.0
    publisher_retry_seconds: float = 0.5
    # a backlog of six forms two batches of three: one per worker child (batches.py)
    worker_claim_jobs: int = 3
    db_connect_timeout: int = 2
    render_chunk_size: int = 25
    task_time_limit: int = 120
    broker_visibility_timeout: int = 300
    scheduler_tick_seconds: float = 2.0
    fast_worker_concurrency: int = 2
    bulk_worker_concurrency: int = 1
    api_workers: int = 2
    # Lets the drills see every file a losing lease or a dead worker left behind.
    hygiene_interval_seconds: float = 3600.0
    # The drills judge recovery, not the submit rate limit (docs/limits.md): their loads
    # submit at up to the default 10/s, in bursts when a process comes back.
    tenant_submit_rate: float = 1000.0
    tenant_submit_burst: int = 1000
    # Checkpoints of bulk renders often enough that a drill tenant's bulk export has several
    # (on S3 a checkpoint still needs a part: S3_MULTIPART_PART_SIZE, 5 MiB in the drills).
    checkpoint_bytes: int = 64 * 1024
    # The 200,000-note export of bulk_resume_200k (the default limit is 100,000).
    max_selection: int = 250_000

    def env(self) -> dict[str, str]:
        """The settings as environment variables for the Procfile processes."""
        return {
            "LEASE_SECONDS": str(self.lease_seconds),
            "BULK_LEASE_SECONDS": str(self.bulk_lease_seconds),
            "SCANNER_INTERVAL_SECONDS": str(self.scanner_interval_seconds),
            "RETRY_BASE_SECONDS": str(self.retry_base_seconds),
            "RETRY_CAP_SECONDS": str(self.retry_cap_seconds),
            "DISPATCH_THRESHOLD_SECONDS": str(self.dispatch_threshold_seconds),
            "DISPATCH_BACKOFF_MAX_FACTOR": str(self.dispatch_backoff_max_factor),
            "MAX_ATTEMPTS": str(self.max_attempts),
            "PUBLISHER_POLL_SECONDS": str(self.publisher_poll_seconds),
            "PUBLISHER_CLAIM_SECONDS": str(self.publisher_claim_seconds),
            "PUBLISHER_RETRY_SECONDS": str(self.publisher_retry_seconds),
            "WORKER_CLAIM_JOBS": str(self.worker_claim_jobs),
            "DB_CONNECT_TIMEOUT": str(self.db_connect_timeout),
            "RENDER_CHUNK_SIZE": str(self.render_chunk_size),
            "TASK_TIME_LIMIT": str(self.task_time_limit),
            "BROKER_VISIBILITY_TIMEOUT": str(self.broker_visibility_timeout),
            "SCHEDULER_TICK_SECONDS": str(self.scheduler_tick_seconds),
            "FAST_WORKER_CONCURRENCY": str(self.fast_worker_concurrency),
            "BULK_WORKER_CONCURRENCY": str(self.bulk_worker_concurrency),
            "API_WORKERS": str(self.api_workers),
            "HYGIENE_INTERVAL_SECONDS": str(self.hygiene_interval_seconds),
            "TENANT_SUBMIT_RATE": str(self.tenant_submit_rate),
            "TENANT_SUBMIT_BURST": str(self.tenant_submit_burst),
            "CHECKPOINT_BYTES": str(self.checkpoint_bytes),
            "MAX_SELECTION": str(self.max_selection),
        }

    def with_(self, **changes: Any) -> DrillSettings:
        """A copy with some values changed."""
        return replace(self, **changes)

    # --- budgets (docs/architecture.md, Service levels, evaluated with these settings) -------

    @property
    def scan_budget(self) -> float:
        """Longest time between two scanner passes: the interval plus its jitter, plus the
        pass's own work (``SCAN_PASS_ALLOWANCE``)."""
        return self.scanner_interval_seconds * (1 + SCANNER_JITTER) + SCAN_PASS_ALLOWANCE

    @property
    def lease_recovery_budget(self) -> float:
        """Worker death → job claimable again: lease + scan interval + backoff cap."""
        return self.lease_seconds + self.scan_budget + self.retry_cap_seconds

    def dispatch_recovery_budget(self, dispatch_count: int = 1) -> float:
        """Message lost → new outbox event: the dispatch threshold for a job dispatched
        ``dispatch_count`` times (it doubles per dispatch, capped) + scan interval."""
        doubled: int = 2 ** max(dispatch_count - 1, 0)  # int ** int is typed Any
        factor = min(doubled, self.dispatch_backoff_max_factor)
        return self.dispatch_threshold_seconds * factor + self.scan_budget

    def budgets(self) -> dict[str, float]:
        """The budgets a report prints next to the measured times."""
        return {
            "scan_seconds": round(self.scan_budget, 3),
            "lease_recovery_seconds": round(self.lease_recovery_budget, 3),
            "lost_dispatch_recovery_seconds": round(self.dispatch_recovery_budget(1), 3),
            "lost_dispatch_recovery_seconds_max_factor": round(
                self.dispatch_recovery_budget(99), 3
            ),
            **{
                f"pg_{how}_unavailable_seconds": round(self.failover_unavailable_budget(how), 3)
                for how in ("switchover", "crash", "kill")
            },
        }

    def failover_unavailable_budget(self, how: FailoverKind) -> float:
        """Longest time clients may get no 202 when the PostgreSQL primary goes away
        (docs/operations.md, "What bounds the unavailability"): the time until Patroni's
        leader key is free, then ``FAILOVER_ALLOWANCE_SECONDS``.

        - ``switchover``: the leader releases its key itself.
        - ``crash`` (its PostgreSQL died, its Patroni lives): Patroni notices within one
          ``loop_wait`` and, with ``primary_start_timeout`` 0, releases the key.
        - ``kill`` (its machine died: Patroni and PostgreSQL killed together): nobody releases
          the key; it expires ``ttl`` after its last renewal (Patroni's floor: 20 s)."""
        key_free = {
            "switchover": 0.0,
            "crash": float(TIMING.loop_wait + TIMING.primary_start_timeout),
            "kill": TIMING.key_expiry_after_death,
        }[how]
        return key_free + FAILOVER_ALLOWANCE_SECONDS

    def as_dict(self) -> dict[str, Any]:
        """Everything, for the evidence files."""
        return asdict(self)


CI_SETTINGS = DrillSettings(lease_seconds=3.0, dispatch_threshold_seconds=3.0)
"""Shorter still, for the drills ``make test`` runs."""
