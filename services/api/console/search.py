"""``/console/search``: find a job by its id, the first characters of its id, or the short
form the lists show (``0190ab12…5e6f``: the id's first 8 and last 4 characters), from the
search field of every page. One match opens the job; several are listed."""

from __future__ import annotations

import re
from dataclasses import dataclass
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from exportcore.store import console as console_store
from services.api.console.render import page
from services.api.console.sessions import CurrentOperator
from services.api.deps import PoolDep

router = APIRouter(prefix="/console/search", include_in_schema=False)

LIMIT = 50
MIN_PREFIX = 4
_HEX = re.compile(r"^[0-9a-f]*$")


@dataclass(frozen=True)
class IdSearch:
    """What a search term means: the id range of its prefix and, for the short form, the
    characters the id ends with."""

    low: UUID
    high: UUID
    suffix: str | None


def _uuid(hex32: str) -> UUID:
    return UUID(hex=hex32)


def parse_term(term: str) -> IdSearch | str:
    """A search term as an id range (see the module docstring), or why it is not one."""
    text = term.strip().lower().replace("...", "…")
    head, _, tail = text.partition("…")
    head, tail = head.replace("-", ""), tail.replace("-", "").strip()
    if not head or not _HEX.match(head) or not _HEX.match(tail) or len(head) > 32:
        return "search by a job id, its first characters, or the short form shown in lists"
    if len(head) < MIN_PREFIX:
        return f"give at least {MIN_PREFIX} characters of the id"
    if len(tail) > 12:
        return "the short form ends with at most 12 characters of the id"
    low = _uuid(head.ljust(32, "0"))
    high = _uuid(head.ljust(32, "f"))
    # the last 12 characters of an id's text form are one group, without a dash
    return IdSearch(low, high, tail or None)


@router.get("")
def search(request: Request, operator: CurrentOperator, pool: PoolDep) -> Response:
    """The jobs whose id matches ``q``; one match opens its page."""
    term = request.query_params.get("q", "")[:100]
    parsed = parse_term(term) if term.strip() else "type a job id, or its first characters"
    rows: list[dict[str, object]] = []
    if isinstance(parsed, IdSearch):
        with pool.connection() as conn:
            rows = console_store.jobs_by_id_range(
                conn, low=parsed.low, high=parsed.high, suffix=parsed.suffix, limit=LIMIT + 1
            )
        if len(rows) == 1:
            return RedirectResponse(f"/console/jobs/{rows[0]['id']}", status_code=303)
    return page(
        request,
        "search.html",
        {
            "nav": "",
            "term": term,
            "error": parsed if isinstance(parsed, str) else None,
            "items": rows[:LIMIT],
            "more": len(rows) > LIMIT,
        },
        status=400 if isinstance(parsed, str) and term.strip() else 200,
    )
