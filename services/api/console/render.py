"""Rendering console pages: one Jinja2 environment (autoescaped), the filters the templates
use, and the security headers of every console response."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from fastapi import Request
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape
from starlette.responses import HTMLResponse
from starlette.types import Message, Receive, Scope, Send

from exportcore.domain import count_of, status_words
from services.api import request_ids
from services.api.asgi import HTTPMiddleware, WatchedSend
from services.api.console import timeline
from services.api.cron_words import describe

HERE = Path(__file__).resolve().parent
TEMPLATES = Jinja2Templates(directory=str(HERE / "templates"))
STATIC_DIR = HERE / "static"

# Everything the console loads comes from the api itself: no CDN, no inline script or
# style (htmx runs with allowEval off and without its inline indicator styles).
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}


class ConsoleHeaders(HTTPMiddleware):
    """ASGI middleware: the security headers on every response under ``/console``, and
    ``Cache-Control: no-store`` on all but its static files (pages show live, per-operator
    data; the static files are versioned by the package)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request, with the headers above when its path is the console's."""
        path = scope.get("path", "")
        if not (path == "/console" or path.startswith("/console/")):
            await self.app(scope, receive, send)
            return
        static = path.startswith("/console/static/")

        def set_headers(start: Message) -> None:
            # ours replace any the app set (SecurityHeaders already adds nosniff: once only)
            ours = {name.lower().encode() for name in SECURITY_HEADERS}
            headers = [
                (k, v)
                for k, v in start.get("headers", [])
                if k.lower() not in ours and (k.lower() != b"cache-control" or static)
            ]
            for name, value in SECURITY_HEADERS.items():
                headers.append((name.lower().encode(), value.encode()))
            headers.append((b"cache-control", b"public, max-age=3600" if static else b"no-store"))
            start["headers"] = headers

        await self.app(scope, receive, WatchedSend(send, on_start=set_headers))


def utc(value: datetime | None) -> Markup:
    """A ``<time>`` element: UTC in the markup and on hover; console.js shows it in the
    browser's zone (without JavaScript it reads as UTC)."""
    if value is None:
        return Markup("—")
    v = value.astimezone(UTC)
    iso = v.isoformat(timespec="seconds").replace("+00:00", "Z")
    text = v.strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup(f'<time datetime="{iso}" title="{text}" data-local>{escape(text)}</time>')


def ago(value: datetime | None, now: datetime | None = None) -> str:
    """``3 min ago`` / ``in 4 s`` relative to ``now``."""
    if value is None:
        return "—"
    now = now or datetime.now(UTC)
    seconds = (now - value).total_seconds()
    text = timeline.human_duration(seconds)
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def query(base: dict[str, Any], **changes: Any) -> str:
    """``?a=1&b=2`` from ``base`` with ``changes`` applied; None and empty values dropped."""
    merged = {**base, **changes}
    pairs = {k: v for k, v in merged.items() if v not in (None, "")}
    return "?" + urlencode(pairs) if pairs else "?"


TEMPLATES.env.filters.update(
    count_of=count_of,
    status_words=status_words,
    utc=utc,
    ago=ago,
    duration=timeline.human_duration,
    short=timeline.short,
    sanitise=timeline.sanitise_detail,
    cron_words=describe,
)


def _asset_version() -> str:
    digest = hashlib.sha256()
    for path in sorted(STATIC_DIR.iterdir()):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


TEMPLATES.env.globals.update(query=query, asset_version=_asset_version())


def page(
    request: Request,
    template: str,
    context: dict[str, Any],
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> HTMLResponse:
    """Render ``template`` with ``context`` plus what every page needs: the operator and
    the session's CSRF token (``request.state.operator``), the settings and ``now``."""
    settings = request.app.state.settings
    operator = getattr(request.state, "operator", None)
    ctx = {
        "request": request,
        "operator": operator,
        "csrf_token": operator.csrf_token if operator else "",
        "settings": settings,
        "now": datetime.now(UTC),
        "htmx": request.headers.get("hx-request") == "true",
        **context,
    }
    return TEMPLATES.TemplateResponse(request, template, ctx, status_code=status, headers=headers)


# What a redirect after an action tells the operator (``?done=<code>``): fixed sentences,
# so a link cannot put text of its choosing on the page.
NOTICES = {
    "replayed": "Replay accepted: this is the new job. It goes through the same queue as any "
    "export, and this page follows it live.",
    "already_replayed": "That job had already been replayed: this is its replay (nothing new "
    "was created).",
    "cancel_requested": "Cancel requested. The job is running: its worker stops at its next "
    "chunk boundary, then the job becomes cancelled; nothing is published.",
    "cancelled": "Cancelled. The job was queued, so it was cancelled at once: no worker runs it.",
    "bulk_started": "Bulk action started: it runs in batches, and this page follows it live.",
    "bulk_resumed": "The bulk runners were woken: one takes the run on from its last "
    "committed batch as soon as nobody holds it.",
    "redelivered": "The attempt's message is queued again, with the same webhook-id.",
    "resolved": "Dead letter marked resolved.",
    "not_resolved": "Nothing changed: the dead letter was already resolved.",
    "paused": "Schedule paused: no new slots run until it is resumed.",
    "resumed": "Schedule resumed: missed slots follow its catch-up policy.",
    "dispatch_paused": "Dispatch paused: its exports wait in the outbox, queued, until it is "
    "resumed; running exports finish.",
    "dispatch_resumed": "Dispatch resumed: what waited is sent to the workers now.",
    "run_now": "Schedule run now: this is its export (a manual slot, through admission control "
    "like every slot).",
}


def notice(request: Request) -> str | None:
    """The sentence for the ``done`` code of a post-action redirect, if any."""
    return NOTICES.get(request.query_params.get("done", ""))


def error_page(request: Request, status: int, title: str, detail: str) -> HTMLResponse:
    """An error as a console page (the API's errors are problem+json; pages are HTML), with
    the request's id (as in ``X-Request-ID``) for the operator to quote."""
    context = {"title": title, "detail": detail, "request_id": request_ids.current()}
    return page(request, "error.html", context, status=status)


def found_or_404(
    request: Request,
    raw: str,
    find: Callable[[UUID], Mapping[str, Any] | None],
    what: str,
    named: str | None = None,
) -> dict[str, Any] | HTMLResponse:
    """What ``find`` gives for the path's id ``raw`` (a UUID), as a dict, or the console's
    404 page (``No such <what>``, ``There is no <named or what> <raw, at most 40
    characters>.``) when ``raw`` is not a UUID or ``find`` gives None (any tenant's row: the
    console is an operator's view)."""
    found: Mapping[str, Any] | None
    try:
        key = UUID(raw)
    except ValueError:
        found = None
    else:
        found = find(key)
    if found is None:
        return error_page(
            request, 404, f"No such {what}", f"There is no {named or what} {raw[:40]}."
        )
    return dict(found)
