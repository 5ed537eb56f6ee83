"""Liveness and readiness. (Metrics are not here: each process serves them on its own port.)"""

from __future__ import annotations

from fastapi import APIRouter

from services.api.deps import PoolDep
from services.api.problems import ProblemError, problem_responses

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is alive")
def healthz() -> dict[str, str]:
    """Always 200 while the process serves requests."""
    return {"status": "ok"}


@router.get("/readyz", responses=problem_responses(503), summary="The database is reachable")
def readyz(pool: PoolDep) -> dict[str, str]:
    """200 when a pooled connection answers ``SELECT 1``, else 503 problem."""
    try:
        with pool.connection(timeout=2.0) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        raise ProblemError(
            503,
            "not_ready",
            "Service unavailable",
            f"database check failed: {type(exc).__name__}",
            headers={"Retry-After": "2"},
        ) from exc
    return {"status": "ready"}
