"""Admission control: one rule for every entry point (API submit, replay, schedules).

Global capacity counts active jobs (queued + running, including those whose outbox event is
not yet published); each tenant also has a quota of active jobs (``TENANT_ACTIVE_QUOTA``,
overridable per tenant). The check runs inside the submitting transaction as its last
statement before COMMIT, serialised by a transaction-scoped advisory lock, so concurrent
submits can never overshoot (DESIGN.md invariant 9); when it refuses, the transaction rolls
back and nothing is written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg

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


def admit(conn: Conn, *, tenant_id: str, settings: Settings) -> None:
    """Check capacity and quota for the job just written in ``conn``'s transaction.

    Must be the last statement before COMMIT. Raises ``CapacityExceeded`` or
    ``QuotaExceeded`` (the caller must roll back); other database errors propagate.
    """
    try:
        admission_store.admission_admit(
            conn,
            tenant_id=tenant_id,
            capacity=settings.admission_capacity,
            default_quota=settings.tenant_active_quota,
        )
    except psycopg.Error as exc:
        retry_after = settings.admission_retry_after_seconds
        message = exc.diag.message_primary or str(exc)
        if exc.sqlstate == CAPACITY_SQLSTATE:
            # the counts are every tenant's load: for operators (logs, metrics), not for the
            # tenant that is refused
            log.info("admission refused", extra={"tenant_id": tenant_id, "error": message})
            raise CapacityExceeded(CAPACITY_DETAIL, retry_after) from None
        if exc.sqlstate == QUOTA_SQLSTATE:
            raise QuotaExceeded(message, retry_after) from None
        raise


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
