"""``/console/tenants``: each tenant's quota, active jobs and recent refusals."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from exportcore.store import console as console_store
from services.api.console.render import page
from services.api.console.sessions import CurrentOperator
from services.api.deps import PoolDep, SettingsDep

router = APIRouter(prefix="/console/tenants", include_in_schema=False)

PAGE_SIZE = 100


@router.get("")
def tenants_page(
    request: Request, operator: CurrentOperator, pool: PoolDep, settings: SettingsDep
) -> Response:
    """Tenants by id (pages of 100), optionally those whose id starts with ``prefix``."""
    after = request.query_params.get("after", "")[:63] or None
    prefix = request.query_params.get("prefix", "").strip()[:63] or None
    with pool.connection() as conn:
        rows = console_store.tenants_page(
            conn,
            limit=PAGE_SIZE + 1,
            default_quota=settings.tenant_active_quota,
            after=after,
            prefix=prefix,
        )
    items = rows[:PAGE_SIZE]
    return page(
        request,
        "tenants.html",
        {
            "nav": "tenants",
            "items": items,
            "prefix": prefix or "",
            "next_after": items[-1]["id"] if len(rows) > PAGE_SIZE else None,
            "first_page": after is not None,
            "default_quota": settings.tenant_active_quota,
        },
    )
