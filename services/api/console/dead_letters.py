"""``/console/dead-letters``: dead letters grouped by reason, one reason's dead letters,
"mark resolved"; the bulk replay of a reason goes to the bulk confirmation
(``services/api/console/bulk.py``)."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from exportcore.store import console as console_store
from services.api.console import actions
from services.api.console.render import error_page, notice, page
from services.api.console.sessions import Action, CurrentOperator, admin_action
from services.api.deps import PoolDep

router = APIRouter(prefix="/console/dead-letters", include_in_schema=False)

PAGE_SIZE = 50
REASON = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")


@router.get("")
def groups(request: Request, operator: CurrentOperator, pool: PoolDep) -> Response:
    """Dead letters by reason: how many, how many still open."""
    with pool.connection() as conn:
        rows = console_store.dead_letter_groups(conn)
    return page(
        request, "dead_letters.html", {"nav": "dead", "groups": rows, "notice": notice(request)}
    )


def _reason(request: Request, reason: str) -> Response | None:
    if not REASON.match(reason):
        return error_page(request, 404, "No such reason", "Dead-letter reasons are error codes.")
    return None


@router.get("/{reason}")
def reason_page(
    request: Request, reason: str, operator: CurrentOperator, pool: PoolDep
) -> Response:
    """One reason's dead letters, newest first (keyset pages)."""
    if (bad := _reason(request, reason)) is not None:
        return bad
    before_raw = request.query_params.get("before", "")
    before = int(before_raw) if before_raw.isdigit() and len(before_raw) < 19 else None
    with pool.connection() as conn:
        rows = console_store.dead_letters_page(
            conn, reason=reason, limit=PAGE_SIZE + 1, before=before
        )
        group = next(iter(console_store.dead_letter_groups(conn, reason=reason)), None)
    items = rows[:PAGE_SIZE]
    return page(
        request,
        "dead_letter_reason.html",
        {
            "nav": "dead",
            "reason": reason,
            "group": group,
            "items": items,
            "next_before": items[-1]["id"] if len(rows) > PAGE_SIZE else None,
            "first_page": before is not None,
            "notice": notice(request),
        },
    )


@router.get("/{reason}/replay")
def bulk_confirm(request: Request, reason: str, operator: CurrentOperator) -> Response:
    """Replaying every open dead letter of the reason is a bulk replay by filter: its
    confirmation counts them first (``/console/bulk/replay``)."""
    if (bad := _reason(request, reason)) is not None:
        return bad
    return RedirectResponse(f"/console/bulk/replay?{urlencode({'error_code': reason})}", 303)


@router.post("/{dead_letter_id}/resolve")
def resolve(
    request: Request,
    dead_letter_id: str,
    action: Annotated[Action, admin_action("resolve")],
    pool: PoolDep,
) -> Response:
    """Mark one dead letter resolved (by the signed-in operator)."""
    if not dead_letter_id.isdigit() or len(dead_letter_id) > 18:
        return error_page(request, 404, "No such dead letter", "Dead letters have numeric ids.")
    note = str(action.form.get("note") or "")[:500]
    ok = actions.resolve_dead_letter(
        pool, dead_letter_id=int(dead_letter_id), actor=action.operator.actor, note=note
    )
    back = str(action.form.get("next") or "/console/dead-letters")
    if not back.startswith("/console/") or "//" in back:
        back = "/console/dead-letters"
    sep = "&" if "?" in back else "?"
    return RedirectResponse(f"{back}{sep}done={'resolved' if ok else 'not_resolved'}", 303)
