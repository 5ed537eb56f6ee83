"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from exportcore import metrics
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


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text"}},
    summary="Prometheus metrics of every api worker",
)
def metrics_endpoint() -> Response:
    """Counters and histograms of all gunicorn workers (multi-process mode)."""
    return Response(generate_latest(metrics.registry()), media_type=CONTENT_TYPE_LATEST)
