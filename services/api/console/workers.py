"""``/console/workers``: each Celery worker with its host, queues, jobs in hand and last
heartbeat (:mod:`exportcore.workers`); a read, for every role."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from exportcore import workers
from services.api.console.render import page
from services.api.console.sessions import CurrentOperator
from services.api.deps import SettingsDep

router = APIRouter(prefix="/console/workers", include_in_schema=False)


@router.get("")
def workers_page(request: Request, operator: CurrentOperator, settings: SettingsDep) -> Response:
    """The workers, by name; at most :data:`exportcore.workers.DEFAULT_TIMEOUT` seconds of
    waiting for their answers, and a notice when the broker could not be read."""
    report = workers.list_workers(settings)
    return page(
        request,
        "workers.html",
        {"nav": "workers", "report": report, "items": report.workers},
    )
