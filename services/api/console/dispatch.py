"""``/console/dispatch/pause`` and ``/console/dispatch/resume``: the overview's control that
pauses and resumes dispatch of a queue, or of one tenant on a queue.

A thin call into :mod:`exportcore.pauses`, the same code as the admin API
(``/v1/admin/queues/{queue}/pause``): a required reason, the ``admin`` role
(``queue_pause`` / ``queue_resume``, refused for a viewer's forged POST), and the audit row
in the change's transaction. The overview shows every pause in force beside the queues.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from exportcore import pauses
from exportcore.domain import ExportError
from exportcore.pauses import Scope
from services.api.console.render import error_page
from services.api.console.sessions import Action, admin_action
from services.api.deps import PoolDep

log = logging.getLogger(__name__)

router = APIRouter(prefix="/console/dispatch", include_in_schema=False)


def _scope(action: Action) -> tuple[Scope, str]:
    """The scope and reason of the submitted form (``queue``, ``tenant`` (empty: the whole
    queue), ``reason``), each bounded before the library checks them."""
    form = action.form
    tenant = str(form.get("tenant") or "").strip()[:63] or None
    return Scope(str(form.get("queue") or "")[:40], tenant), str(form.get("reason") or "")[:600]


def _change(request: Request, action: Action, pool: PoolDep, verb: str) -> Response:
    scope, reason = _scope(action)
    change = pauses.pause if verb == "pause" else pauses.resume
    try:
        change(pool, scope, reason=reason, actor=action.operator.actor)
    except ExportError as exc:
        status = 422 if exc.kind == "invalid" else 409
        return error_page(request, status, f"Dispatch was not {verb}d", exc.detail)
    log.info(
        f"console dispatch {verb}d",
        extra={
            "queue": scope.queue,
            "tenant_id": scope.tenant_id,
            "operator_key_id": str(action.operator.key_id),
        },
    )
    return RedirectResponse(f"/console/?done=dispatch_{verb}d#dispatch", 303)


@router.post("/pause")
def pause(
    request: Request, action: Annotated[Action, admin_action("queue_pause")], pool: PoolDep
) -> Response:
    """Pause dispatch of the form's queue (or of its tenant on it), for its reason."""
    return _change(request, action, pool, "pause")


@router.post("/resume")
def resume(
    request: Request, action: Annotated[Action, admin_action("queue_resume")], pool: PoolDep
) -> Response:
    """Resume dispatch of the form's queue (or of its tenant on it), for its reason."""
    return _change(request, action, pool, "resume")
