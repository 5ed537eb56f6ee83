"""``/v1/admin/workers``: the Celery workers as the broker and their liveness data know them
(:mod:`exportcore.workers`), for operator keys of any role (a read; docs/operations.md,
"Workers")."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from exportcore import workers
from services.api.deps import Operator, SettingsDep
from services.api.problems import problem_responses

router = APIRouter(prefix="/v1/admin/workers", tags=["admin"])


class Worker(BaseModel):
    """One worker: node name and host; ``answered`` false when the broker knows it (its
    remote-control mailbox is bound) but it did not answer within the timeout; its queues,
    the export jobs it runs (``active_jobs``) and holds reserved, their sum
    (``jobs_in_hand``), its pool size, pid, and its last heartbeat (its liveness file's
    time, null without one) with that heartbeat's age in seconds."""

    name: str
    host: str
    answered: bool
    queues: list[str]
    active_jobs: list[str]
    reserved_jobs: list[str]
    jobs_in_hand: int
    concurrency: int | None
    pid: int | None
    heartbeat_at: datetime | None
    heartbeat_age_seconds: float | None
    liveness_file: bool | None


class WorkersList(BaseModel):
    """Every worker at ``checked_at``; ``error`` when the broker could not be read in time
    (the list is then what was known)."""

    checked_at: datetime
    timeout_seconds: float
    error: str | None = Field(description="null when the broker answered")
    workers: list[Worker]


@router.get(
    "",
    response_model=WorkersList,
    responses=problem_responses(401, 403, 422),
    summary="The Celery workers",
)
def list_workers(
    caller: Operator,
    settings: SettingsDep,
    timeout: float = Query(
        default=workers.DEFAULT_TIMEOUT,
        ge=0.1,
        le=5.0,
        description="seconds to wait for the workers' answers",
    ),
) -> WorkersList:
    """Each worker with its host, queues, jobs in hand and last heartbeat; answers within
    about ``timeout`` seconds even when the broker is slow or down (``error`` says so)."""
    return WorkersList.model_validate(workers.list_workers(settings, timeout=timeout).as_json())
