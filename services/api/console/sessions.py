"""Console sign-in: server-side sessions behind an HttpOnly, SameSite=Strict cookie, and CSRF
protection on every state-changing request.

- **Session**: signing in with an operator key (``exportctl operator-key create``; an
  :class:`AuthContext` of kind ``operator``, never a tenant's key) stores a new session in
  PostgreSQL (``console_sessions``: only the SHA-256 of the cookie's 256-bit token, like API
  keys) and sets the cookie. Every request re-reads the session together
  with its key, so logout, the idle timeout, the absolute lifetime and a revoked key end it
  at once, on every api replica. A new token is issued at each sign-in (no fixation).
- **Cookie**: ``HttpOnly``, ``SameSite=Strict``, ``Path=/console``. ``Secure`` follows
  ``CONSOLE_COOKIE_SECURE``: ``auto`` sets it when the browser reached the api over https
  (the request's scheme, or ``X-Forwarded-Proto: https`` from the ingress that terminated
  TLS); over plain http (``make dev`` on localhost) the cookie cannot be ``Secure``, or the
  browser would never send it back.
- **CSRF** (OWASP CSRF Prevention Cheat Sheet): the synchronizer token pattern. Each session
  has its own random token, embedded in every page (a hidden ``csrf_token`` field of each
  form, and an ``X-CSRF-Token`` header on htmx requests); a POST without the session's token
  is refused with 403 before anything happens. As defence in depth, a POST whose ``Origin``
  (or, without one, ``Referer``) names another site is refused too, and SameSite=Strict keeps
  the browser from sending the cookie on cross-site requests at all. The sign-in form itself
  is protected by a double-submit token in a short-lived cookie (there is no session yet).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit
from uuid import UUID

from fastapi import Depends, Request
from starlette.datastructures import FormData
from starlette.responses import Response

from exportcore.audit import Actor
from exportcore.auth import AuthContext, authenticate, authorize, operator_context
from exportcore.db import Row
from exportcore.settings import Settings
from exportcore.store import console as console_store
from services.api.deps import PoolDep, SettingsDep

log = logging.getLogger(__name__)

COOKIE = "nex_console"
LOGIN_COOKIE = "nex_console_login"
PATH = "/console"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"


class SignInRequired(Exception):
    """No valid session: the console answers with a redirect to the sign-in page."""


class CsrfRefused(Exception):
    """A state-changing request without the session's CSRF token (or from another site)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotAnOperator(Exception):
    """The key is valid but is a tenant's, not an operator's."""


@dataclass(frozen=True)
class Operator:
    """The signed-in operator: the operator key's identity (``prefix`` and ``label`` name
    it on the page and in "replayed by" / "resolved by"), the session's CSRF token and the
    key's :class:`AuthContext` (kind ``operator``)."""

    key_id: UUID
    prefix: str
    label: str
    csrf_token: str
    token_hash: bytes
    auth: AuthContext

    @property
    def actor(self) -> Actor:
        """Who the audit trail and the dead letters name (who replayed, who resolved): the
        same actor the admin API records for this key, ``nex_op_1a2b3c4d (alice)``."""
        return Actor.of(self.auth)

    @property
    def role(self) -> str:
        """The key's role (``viewer`` | ``admin``), read with the session on every request."""
        return self.auth.role or "viewer"

    def may(self, action: str) -> bool:
        """True when this operator may take ``action`` (the pages hide what a viewer cannot
        do; the POST is refused anyway: :func:`admin_action`)."""
        return self.auth.may(action)


def _idle(settings: Settings) -> dict[str, float]:
    """The idle timeout, and how stale a session's "last seen" may get before a request
    marks it again (a minute, or a quarter of a short timeout)."""
    idle = settings.console_idle_minutes * 60
    return {"idle_seconds": idle, "touch_seconds": min(60.0, idle / 4)}


def _hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def is_https(request: Request) -> bool:
    """True when the browser's connection was https: the request's own scheme, or the
    ``X-Forwarded-Proto`` an ingress terminating TLS adds."""
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return request.url.scheme == "https" or forwarded == "https"


def cookie_secure(request: Request, settings: Settings) -> bool:
    """The Secure attribute for this request (``CONSOLE_COOKIE_SECURE``)."""
    mode = settings.console_cookie_secure
    return mode == "always" or (mode == "auto" and is_https(request))


def set_cookie(
    response: Response, request: Request, settings: Settings, name: str, value: str, max_age: int
) -> None:
    """Set a console cookie: HttpOnly, SameSite=Strict, Path=/console, Secure per setting."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=PATH,
        secure=cookie_secure(request, settings),
        httponly=True,
        samesite="strict",
    )


def clear_cookie(response: Response, request: Request, settings: Settings, name: str) -> None:
    """Expire a console cookie (same attributes as when it was set)."""
    response.delete_cookie(
        name,
        path=PATH,
        secure=cookie_secure(request, settings),
        httponly=True,
        samesite="strict",
    )


def sign_in(pool: PoolDep, settings: Settings, presented: str) -> tuple[str, Operator]:
    """Check ``presented`` and open a session; returns ``(cookie token, operator)``.

    Raises ``SignInRequired`` for an unknown, malformed or revoked key and ``NotAnOperator``
    for a tenant's key (valid, but never an operator's). Ended sessions are pruned (a small
    batch) on the way.
    """
    token = secrets.token_urlsafe(32)
    csrf = secrets.token_urlsafe(32)
    with pool.connection() as conn:
        ctx = authenticate(conn, presented.strip())
        if ctx is None:
            raise SignInRequired()
        if not ctx.is_operator:
            raise NotAnOperator()
        console_store.session_prune(
            conn, idle_seconds=settings.console_idle_minutes * 60, limit=100
        )
        console_store.session_insert(
            conn,
            token_hash=_hash(token),
            key_id=ctx.key_id,
            csrf_token=csrf,
            lifetime_seconds=settings.console_session_hours * 3600,
        )
        row = console_store.session_touch(conn, token_hash=_hash(token), **_idle(settings))
    assert row is not None
    return token, _operator(row)


def sign_out(pool: PoolDep, operator: Operator) -> None:
    """End the operator's session (the cookie no longer signs anybody in)."""
    with pool.connection() as conn:
        console_store.session_delete(conn, token_hash=operator.token_hash)


def _operator(row: Row) -> Operator:
    # The operator key's identity (and role) as exportcore.auth.authenticate gives it to the
    # admin API.
    auth = operator_context(row)
    return Operator(
        key_id=row["key_id"],
        prefix=str(row["prefix"]),
        label=str(row["label"] or ""),
        csrf_token=str(row["csrf_token"]),
        token_hash=bytes(row["token_hash"]),
        auth=auth,
    )


def current_operator(request: Request, pool: PoolDep, settings: SettingsDep) -> Operator:
    """The signed-in operator of this request; raises ``SignInRequired`` without a live
    session of an operator key that is not revoked."""
    token = request.cookies.get(COOKIE, "")
    if not token or len(token) > 100:
        raise SignInRequired()
    with pool.connection() as conn:
        row = console_store.session_touch(conn, token_hash=_hash(token), **_idle(settings))
    if row is None:
        raise SignInRequired()
    operator = _operator(row)
    request.state.operator = operator
    return operator


CurrentOperator = Annotated[Operator, Depends(current_operator)]


def same_origin(request: Request) -> bool:
    """False when the request says it comes from another site (``Origin``, else
    ``Referer``, naming another scheme, host or port than the api's own); True when it names
    this site or sends neither (OWASP: verifying origin with standard headers)."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if origin is None:
        return True  # nothing to check: the CSRF token decides
    if origin == "null":  # an opaque origin (sandboxed frame, data: URL): never this site
        return False
    parts = urlsplit(origin)
    host = request.headers.get("x-forwarded-host") or request.headers.get("host", "")
    return parts.netloc.lower() == host.lower()


def check_token(expected: str, presented: str | None) -> bool:
    """Constant-time comparison of a CSRF token."""
    return bool(presented) and hmac.compare_digest(expected.encode(), str(presented).encode())


@dataclass(frozen=True)
class Action:
    """A verified state-changing request: who, and the submitted form."""

    operator: Operator
    form: FormData


async def verified_action(request: Request, operator: CurrentOperator) -> Action:
    """The dependency of every console POST: a signed-in operator, a same-site request and
    the session's CSRF token (form field ``csrf_token`` or header ``X-CSRF-Token``); raises
    ``CsrfRefused`` (403) otherwise, before the route does anything."""
    if not same_origin(request):
        raise CsrfRefused("the request came from another site")
    form = await request.form()
    presented = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD)
    if not check_token(operator.csrf_token, presented if isinstance(presented, str) else None):
        log.warning(
            "console request refused: missing or wrong CSRF token",
            extra={"operator_key_id": str(operator.key_id), "path": request.url.path},
        )
        raise CsrfRefused("the form's security token is missing or does not match the session")
    return Action(operator=operator, form=form)


VerifiedAction = Annotated[Action, Depends(verified_action)]


def admin_action(action: str) -> object:
    """The dependency of a console POST that changes something: a verified request
    (:func:`verified_action`) by an operator whose role allows ``action`` — the same check
    as the admin API's (:func:`exportcore.auth.authorize`); a viewer's forged POST gets 403
    (``RoleRefused``) and nothing happens."""

    async def check(verified: VerifiedAction, request: Request) -> Action:
        try:
            authorize(verified.operator.auth, action)
        except Exception:
            log.warning(
                "console request refused: role",
                extra={
                    "operator_key_id": str(verified.operator.key_id),
                    "path": request.url.path,
                    "action": action,
                },
            )
            raise
        return verified

    return Depends(check)


def new_login_token() -> str:
    """A fresh double-submit token for the sign-in form."""
    return secrets.token_urlsafe(32)
