"""``/v1/admin/audit``: the audit trail (``operator_actions``), for operator keys of any
role: who did what to which target, when, and how it ended (docs/operations.md, "The audit
trail")."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from exportcore.store import operator_actions as action_store
from services.api.deps import Operator, PoolDep
from services.api.problems import problem_responses
from services.api.schemas import Rfc3339

router = APIRouter(prefix="/v1/admin/audit", tags=["admin"])

_NAME = r"^[a-z][a-z_]{0,62}$"


class AuditEntry(BaseModel):
    """One change: ``actor_kind`` (operator, tenant, database, system), the key's id and
    the actor's name (``nex_op_1a2b3c4d (alice)``), the ``action`` and its target, the
    tenant and job it concerns, a bulk action's ``filter`` and ``count``, its ``outcome``
    and details."""

    id: int
    at: datetime
    actor_kind: str
    key_id: UUID | None
    actor: str
    action: str
    target_kind: str
    target_id: str | None
    tenant_id: str | None
    job_id: UUID | None
    filter: dict[str, Any] | None
    count: int | None
    outcome: str
    detail: dict[str, Any]


class AuditPage(BaseModel):
    """Newest first; pass ``next_cursor`` as ``cursor`` for the next page."""

    items: list[AuditEntry]
    next_cursor: int | None = Field(description="null on the last page")


@router.get(
    "",
    response_model=AuditPage,
    responses=problem_responses(401, 403, 422, 503),
    summary="The audit trail",
)
def list_audit(
    caller: Operator,
    pool: PoolDep,
    action: str | None = Query(default=None, pattern=_NAME, description="e.g. replay"),
    actor_kind: str | None = Query(default=None, pattern="^(operator|tenant|database|system)$"),
    key_id: UUID | None = Query(default=None, description="the acting key's id"),
    tenant: str | None = Query(default=None, pattern=r"^[a-z0-9][a-z0-9-]{0,62}$"),
    target_kind: str | None = Query(default=None, pattern=_NAME),
    target_id: str | None = Query(default=None, max_length=200),
    job_id: UUID | None = Query(default=None),
    since: Rfc3339 | None = Query(default=None, description="at or after (RFC 3339)"),
    until: Rfc3339 | None = Query(default=None, description="before (RFC 3339)"),
    limit: int = Query(default=50, ge=1, le=500),
    cursor: int | None = Query(default=None, ge=1, le=2**63 - 1),
) -> AuditPage:
    """Audit rows newest first, filtered by any of the parameters."""
    with pool.connection() as conn:
        rows = action_store.operator_actions_page(
            conn,
            limit=limit + 1,
            before=cursor,
            action=action,
            key_id=key_id,
            actor_kind=actor_kind,
            tenant_id=tenant,
            target_kind=target_kind,
            target_id=target_id,
            job_id=job_id,
            since=since,
            until=until,
        )
    items = [AuditEntry.model_validate(r) for r in rows[:limit]]
    return AuditPage(items=items, next_cursor=items[-1].id if len(rows) > limit else None)
