"""Admission control: one rule for every entry point (API submit, replay, schedules).

Global capacity counts active jobs (queued + running, including those whose outbox event is
not yet published); each tenant also has a quota of active jobs (``TENANT_ACTIVE_QUOTA``,
overridable per tenant). The check runs inside the submitting transaction as its last
step before COMMIT, serialised by the row locks of the admission counters (migration 0008:
admitted counts per scope, released counts kept by a trigger in the same transaction as
each terminal transition), so concurrent submits can never overshoot (docs/architecture.md
INV-9 admission-is-serialised) and the check costs the same with 10 or 10 million active
jobs; when it refuses, the transaction rolls back and nothing is written. A submit is
refused cheaply, before its snapshot is copied, when the counters already show the scope
full. The recovery-scanner reconciles the counters with the rows
(:meth:`exportcore.recovery.RecoveryScanner.reconcile_admission`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from exportcore.db import Conn
from exportcore.domain import ExportError
from exportcore.settings import Settings
from exportcore.store import admission as admission_store

log = logging.getLogger(__name__)

CAPACITY_SQLSTATE = "XEX01"
QUOTA_SQLSTATE = "XEX02"


class AdmissionRefused(ExportError):
    """The job was not admitted; ``retry_after`` is a hint in seconds."""

    code = "admission_refused"

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class CapacityExceeded(AdmissionRefused):
    """Global capacity of active jobs reached (HTTP 503)."""

    code = "capacity_exceeded"


class QuotaExceeded(AdmissionRefused):
    """The tenant's quota of active jobs reached (HTTP 429)."""

    code = "quota_exceeded"


CAPACITY_DETAIL = "the service's export capacity is full"
"""What a refused caller learns about global capacity (never other tenants' counts)."""


def admission_error(exc: psycopg.Error, settings: Settings) -> Exception:
    """The domain error for a database error: ``CapacityExceeded`` (SQLSTATE XEX01, with
    :data:`CAPACITY_DETAIL` only: the counts in the database's message are every tenant's
    load, for operators' logs and metrics, never for the refused tenant), ``QuotaExceeded``
    (XEX02), else ``exc`` itself."""
    retry_after = settings.admission_retry_after_seconds
    message = exc.diag.message_primary or str(exc)
    if exc.sqlstate == CAPACITY_SQLSTATE:
        log.info("admission refused", extra={"error": message})
        return CapacityExceeded(CAPACITY_DETAIL, retry_after)
    if exc.sqlstate == QUOTA_SQLSTATE:
        return QuotaExceeded(message, retry_after)
    return exc


def admit(conn: Conn, *, tenant_id: str, settings: Settings) -> None:
    """Check capacity and quota for the job just written in ``conn``'s transaction.

    Must be the last statement before COMMIT. Raises ``CapacityExceeded`` or
    ``QuotaExceeded`` (the caller must roll back); other database errors propagate.
    """
    admit_many(conn, tenant_id=tenant_id, count=1, settings=settings)


def admit_many(conn: Conn, *, tenant_id: str, count: int, settings: Settings) -> None:
    """:func:`admit` for ``count`` new jobs of one tenant written in ``conn``'s transaction
    (a bulk replay's batch): all of them or none. Call it per tenant in tenant order, last
    before COMMIT. Raises ``CapacityExceeded`` or ``QuotaExceeded`` when the ``count`` jobs
    would overshoot (the caller must roll back); other database errors propagate."""
    try:
        if count == 1:
            admission_store.admission_admit(
                conn,
                tenant_id=tenant_id,
                capacity=settings.admission_capacity,
                default_quota=settings.tenant_active_quota,
            )
        elif count > 1:
            admission_store.admission_admit_many(
                conn,
                tenant_id=tenant_id,
                count=count,
                capacity=settings.admission_capacity,
                default_quota=settings.tenant_active_quota,
            )
    except psycopg.Error as exc:
        error = admission_error(exc, settings)
        if error is exc:
            raise
        raise error from None


def record_refusal(pool: ConnectionPool[Conn], *, tenant_id: str, exc: AdmissionRefused) -> None:
    """Count a refusal a client was told about (a submit) per tenant and minute,
    for operators ("refused in the last hour", the console's tenants page).

    Called after the refused transaction rolled back, in its own statement (one upsert on
    a row of the tenant's ring of 60 minutes, migration 0011). Best effort: a database error
    here is logged and swallowed, so the caller still answers with the refusal itself.
    """
    try:
        with pool.connection(timeout=1.0) as conn:
            admission_store.admission_refusal_record(conn, tenant_id=tenant_id, code=exc.code)
    except (psycopg.Error, PoolTimeout) as err:
        log.warning(
            "admission refusal not recorded",
            extra={"tenant_id": tenant_id, "code": exc.code, "error": type(err).__name__},
        )


@dataclass(frozen=True)
class AdmissionUsage:
    """Active jobs against capacity, and per tenant against its quota."""

    active: int
    capacity: int
    tenants: dict[str, tuple[int, int]]  # tenant id -> (active, quota)


def admission_usage(conn: Conn, settings: Settings) -> AdmissionUsage:
    """Current usage, for metrics (one query; read only)."""
    rows = admission_store.admission_usage(conn, default_quota=settings.tenant_active_quota)
    tenants = {r["tenant_id"]: (int(r["active"]), int(r["quota"])) for r in rows}
    return AdmissionUsage(
        active=sum(a for a, _ in tenants.values()),
        capacity=settings.admission_capacity,
        tenants=tenants,
    )
