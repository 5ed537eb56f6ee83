"""The operator console: server-rendered pages under ``/console`` (Jinja2 templates, htmx
for the live parts, every asset served from this package).

See docs/console.md. :func:`install` adds it to the api app.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from exportcore.auth import RoleRefused
from services.api import problems
from services.api.console import (
    audit,
    auth,
    bulk,
    dead_letters,
    dispatch,
    jobs,
    overview,
    schedules,
    search,
    tenants,
    webhooks,
    workers,
)
from services.api.console.render import STATIC_DIR, ConsoleHeaders, error_page
from services.api.console.sessions import CsrfRefused, SignInRequired


def install(app: FastAPI) -> None:
    """Mount the console's routes, its static files and its error handling on ``app``."""
    app.add_middleware(ConsoleHeaders)
    app.mount("/console/static", StaticFiles(directory=str(STATIC_DIR)), name="console-static")
    for module in (
        auth,
        overview,
        dispatch,
        jobs,
        dead_letters,
        schedules,
        tenants,
        webhooks,
        workers,
        bulk,
        audit,
        search,
    ):
        app.include_router(module.router)

    @app.exception_handler(SignInRequired)
    async def _sign_in(request: Request, exc: SignInRequired) -> Response:
        target = request.url.path
        if request.url.query and request.method == "GET":
            target += "?" + request.url.query
        login = f"/console/login?next={quote(target, safe='/')}"
        if request.headers.get("hx-request") == "true":
            # htmx follows HX-Redirect with a full page load (a live panel whose session
            # ended takes the whole page to the sign-in form).
            return Response(status_code=401, headers={"HX-Redirect": login})
        if request.method != "GET":
            return error_page(
                request, 401, "Signed out", "Your session ended. Sign in again and retry."
            )
        return RedirectResponse(login, status_code=303)

    @app.exception_handler(RoleRefused)
    async def _role(request: Request, exc: RoleRefused) -> Response:
        # The admin API answers problem+json; a console page, HTML.
        if not request.url.path.startswith("/console"):
            return problems.problem_response(
                request, 403, exc.code, exc.title, exc.detail, **exc.extra
            )
        return error_page(
            request,
            403,
            "Not allowed for a viewer",
            f"Nothing was changed: {exc.detail}.",
        )

    @app.exception_handler(CsrfRefused)
    async def _csrf(request: Request, exc: CsrfRefused) -> Response:
        return error_page(
            request,
            403,
            "Request refused",
            f"Nothing was changed: {exc.reason}. Reload the page and try again.",
        )
