"""``/v1/admin/queues``: pause and resume dispatch of a queue, or of one tenant on a queue
(:mod:`exportcore.pauses`; docs/operations.md, "Pausing dispatch").

Reads take any operator key; a pause or a resume an ``admin`` one (``queue_pause`` /
``queue_resume`` of :data:`exportcore.auth.OPERATOR_ACTIONS`), with a required reason, and
each is audited in its own transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from exportcore import pauses
from exportcore.auth import AuthContext
from exportcore.pauses import REASON_MAX, Scope
from services.api.deps import Operator, PoolDep, actor_of, operator_may
from services.api.problems import problem_responses

router = APIRouter(prefix="/v1/admin/queues", tags=["admin"])

Pauser = Annotated[AuthContext, operator_may("queue_pause")]
Resumer = Annotated[AuthContext, operator_may("queue_resume")]
QueueName = Annotated[
    Literal["exports.fast", "exports.bulk"],
    Path(description="the queue: exports.fast or exports.bulk"),
]


class PauseChange(BaseModel):
    """Why (required, kept in the audit trail) and whose work: ``tenant`` alone, or, when
    absent, every tenant of the queue."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=REASON_MAX, description="why, for the audit")
    tenant: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9-]{0,62}$",
        description="only this tenant's dispatch on the queue (absent: the whole queue)",
    )


class PauseOut(BaseModel):
    """A pause in force: its queue, its tenant (null: the whole queue), why, who, since
    when, how long so far (seconds) and the pending outbox events waiting behind it."""

    queue: str
    tenant: str | None
    reason: str
    paused_by: str
    paused_at: datetime
    paused_seconds: float | None = None
    waiting: int | None = None


class ResumedOut(PauseOut):
    """A pause that ended, with when."""

    resumed_at: datetime


class PausesOut(BaseModel):
    """Every pause in force, queue-wide ones first."""

    pauses: list[PauseOut]


def _out(row: dict[str, object]) -> dict[str, object]:
    return {**row, "tenant": row.get("tenant_id")}


@router.get(
    "/pauses",
    response_model=PausesOut,
    responses=problem_responses(401, 403, 503),
    summary="The dispatch pauses in force",
)
def list_pauses(caller: Operator, pool: PoolDep) -> PausesOut:
    """Each pause with its reason, who, since when and the events waiting behind it."""
    return PausesOut(pauses=[PauseOut.model_validate(_out(r)) for r in pauses.pauses(pool)])


@router.post(
    "/{queue}/pause",
    status_code=201,
    response_model=PauseOut,
    responses=problem_responses(400, 401, 403, 409, 415, 422, 503),
    summary="Pause dispatch of a queue, or of one tenant on it",
)
def pause(queue: QueueName, body: PauseChange, caller: Pauser, pool: PoolDep) -> PauseOut:
    """From the next claim of any publisher or worker, the scope's pending exports stay in
    the outbox (queued); running exports finish. Durable (a row of PostgreSQL) and audited
    (``queue_pause``). 409 ``dispatch_already_paused`` names who paused it, when and why."""
    row = pauses.pause(pool, Scope(queue, body.tenant), reason=body.reason, actor=actor_of(caller))
    return PauseOut.model_validate(_out(row))


@router.post(
    "/{queue}/resume",
    response_model=ResumedOut,
    responses=problem_responses(400, 401, 403, 409, 415, 422, 503),
    summary="Resume dispatch of a queue, or of one tenant on it",
)
def resume(queue: QueueName, body: PauseChange, caller: Resumer, pool: PoolDep) -> ResumedOut:
    """Lift the pause of exactly this scope (a tenant's pause and its queue's are separate);
    the publishers are woken and send what waited. Audited (``queue_resume``). 409
    ``dispatch_not_paused`` when the scope was not paused."""
    row = pauses.resume(pool, Scope(queue, body.tenant), reason=body.reason, actor=actor_of(caller))
    return ResumedOut.model_validate(_out(row))
