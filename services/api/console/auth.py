"""``/console/login`` and ``/console/logout``: sign in with an operator key, sign out.

Sign-in attempts are throttled per client address (``CONSOLE_SIGN_IN_RATE`` /
``CONSOLE_SIGN_IN_BURST``, a token bucket of :mod:`exportcore.ratelimit` shared by every api
process): a guesser gets a 429 page with ``Retry-After`` instead of an answer per key, and
every answer to a sign-in carries ``RateLimit-Policy`` / ``RateLimit``
(:mod:`services.api.rate_headers`). The
address is ``request.client.host``: the TCP peer, or, when the peer is a trusted proxy
(``FORWARDED_ALLOW_IPS``, services/api/gunicorn_conf.py; the chart's trustedProxies), the
client that proxy names in X-Forwarded-For — so behind a Gateway each client has its own
bucket, and a client cannot pick its bucket by writing the header itself.
Every refused sign-in is logged as a warning with the client address and the reason, never
with the key or any part of it."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from exportcore import ratelimit
from exportcore.ratelimit import Limit, RateLimiter
from services.api import rate_headers
from services.api.console import sessions
from services.api.console.render import page
from services.api.console.sessions import NotAnOperator, SignInRequired, VerifiedAction
from services.api.deps import PoolDep, SettingsDep

log = logging.getLogger(__name__)

router = APIRouter(prefix="/console", include_in_schema=False)

LOGIN_TOKEN_SECONDS = 3600


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a console path only (never another site)."""
    if (
        value
        and value.startswith("/console")
        and not value.startswith("/console/login")
        and "//" not in value
        and "\\" not in value
    ):
        return value
    return "/console/"


def _login_page(
    request: Request, settings: SettingsDep, error: str = "", status: int = 200
) -> Response:
    token = sessions.new_login_token()
    response = page(
        request,
        "login.html",
        {
            "login_token": token,
            "error": error,
            "next": safe_next(request.query_params.get("next") or request.query_params.get("n")),
            "insecure": not sessions.cookie_secure(request, settings),
        },
        status=status,
    )
    sessions.set_cookie(
        response, request, settings, sessions.LOGIN_COOKIE, token, LOGIN_TOKEN_SECONDS
    )
    return response


@router.get("/login")
def login_form(request: Request, settings: SettingsDep) -> Response:
    """The sign-in form (with a fresh double-submit token)."""
    return _login_page(request, settings)


@router.post("/login")
def login(
    request: Request,
    pool: PoolDep,
    settings: SettingsDep,
    key: Annotated[str, Form()] = "",
    login_token: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/console/",
) -> Response:
    """Check the key and open a session; the form again with the reason when refused."""
    client = request.client.host if request.client else "unknown"
    limiter: RateLimiter = request.app.state.rate_limiter
    decision = limiter.check(
        client,
        Limit(settings.console_sign_in_rate, settings.console_sign_in_burst),
        name=ratelimit.CONSOLE_SIGN_IN,
    )
    rate_headers.remember(request, ratelimit.CONSOLE_SIGN_IN, decision)
    if not decision.allowed:
        log.warning(
            "console sign-in throttled",
            extra={"client": client, "retry_after": round(decision.retry_after, 3)},
        )
        response = _login_page(
            request,
            settings,
            "Too many sign-in attempts from this address. Try again in "
            f"{decision.retry_after_header} s.",
            status=429,
        )
        response.headers["Retry-After"] = decision.retry_after_header
        return response
    if not sessions.same_origin(request) or not sessions.check_token(
        request.cookies.get(sessions.LOGIN_COOKIE, ""), login_token
    ):
        log.warning(
            "console sign-in refused: the form expired or came from elsewhere",
            extra={"client": client, "reason": "form_token"},
        )
        return _login_page(
            request,
            settings,
            "The sign-in form expired or did not come from this console. Try again.",
            status=403,
        )
    try:
        token, operator = sessions.sign_in(pool, settings, key)
    except SignInRequired:
        log.warning(
            "console sign-in refused: unknown or revoked key",
            extra={"client": client, "reason": "unknown_key"},
        )
        return _login_page(request, settings, "That key is unknown or revoked.", status=401)
    except NotAnOperator:
        log.warning(
            "console sign-in refused: a tenant key, not an operator key",
            extra={"client": client, "reason": "tenant_key"},
        )
        return _login_page(
            request,
            settings,
            "That is a tenant's key, not an operator key. The console needs an operator "
            "key: exportctl operator-key create --label YOUR-NAME",
            status=403,
        )
    log.info("console sign-in", extra={"operator_key_id": str(operator.key_id), "client": client})
    response = RedirectResponse(safe_next(next), status_code=303)
    sessions.set_cookie(
        response,
        request,
        settings,
        sessions.COOKIE,
        token,
        int(settings.console_session_hours * 3600),
    )
    sessions.clear_cookie(response, request, settings, sessions.LOGIN_COOKIE)
    return response


@router.post("/logout")
def logout(
    request: Request, action: VerifiedAction, pool: PoolDep, settings: SettingsDep
) -> Response:
    """End the session and go back to the sign-in form."""
    sessions.sign_out(pool, action.operator)
    log.info("console sign-out", extra={"operator_key_id": str(action.operator.key_id)})
    response = RedirectResponse("/console/login?signed_out=1", status_code=303)
    sessions.clear_cookie(response, request, settings, sessions.COOKIE)
    return response
