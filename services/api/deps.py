"""FastAPI dependencies as typed aliases: settings, pool, artifact store, caller identity.

Dependencies that do no I/O are ``async`` so FastAPI runs them in the event loop: only the
API-key lookup (and the route itself) goes to a worker thread.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from psycopg_pool import ConnectionPool

from exportcore import metrics, ratelimit
from exportcore.admission import AdmissionRefused
from exportcore.artifacts import ArtifactStore
from exportcore.audit import Actor
from exportcore.auth import ApiKeyCache, AuthContext, TenantContext, authenticate, authorize
from exportcore.coalesce import SubmitCoalescer
from exportcore.db import Conn
from exportcore.ratelimit import Decision, Limit, RateLimiter, TenantLimits
from exportcore.settings import Settings
from services.api import rate_headers
from services.api.problems import ProblemError


async def _settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def _pool(request: Request) -> ConnectionPool[Conn]:
    return request.app.state.pool  # type: ignore[no-any-return]


async def _store(request: Request) -> ArtifactStore:
    return request.app.state.store  # type: ignore[no-any-return]


async def _coalescer(request: Request) -> SubmitCoalescer | None:
    return request.app.state.submit_coalescer  # type: ignore[no-any-return]


SettingsDep = Annotated[Settings, Depends(_settings)]
CoalescerDep = Annotated[SubmitCoalescer | None, Depends(_coalescer)]
"""The api process's submit coalescer (None with API_SUBMIT_BATCH = 1)."""
PoolDep = Annotated[ConnectionPool[Conn], Depends(_pool)]
StoreDep = Annotated[ArtifactStore, Depends(_store)]

_UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="notes-exports"'}


_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="apiKey",
    description="A tenant's key (`exportctl apikey create`) for /v1/exports and /v1/schedules, "
    "or an operator key (`exportctl operator-key create`) for /v1/admin, as a bearer token.",
)


def _caller(
    request: Request,
    pool: PoolDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> AuthContext:
    presented = credentials.credentials if credentials is not None else ""
    if not presented.strip():
        raise ProblemError(
            401,
            "unauthenticated",
            "Missing or invalid API key",
            "send 'Authorization: Bearer <api key>'",
            headers=_UNAUTHORIZED,
        )

    def lookup(key: str) -> AuthContext | None:
        with pool.connection() as conn:
            return authenticate(conn, key)

    cache: ApiKeyCache = request.app.state.key_cache
    ctx = cache.authenticate(presented.strip(), lookup)
    if ctx is None:
        raise ProblemError(
            401,
            "unauthenticated",
            "Missing or invalid API key",
            "the API key is unknown or revoked",
            headers=_UNAUTHORIZED,
        )
    return ctx


Caller = Annotated[AuthContext, Depends(_caller)]


def require_scope(scope: str) -> object:
    """A dependency for tenant routes: 403 unless the caller is a tenant key carrying
    ``scope``. Operator keys act for no tenant, so they are refused here too (403)."""

    async def check(caller: Caller) -> TenantContext:
        if not isinstance(caller, TenantContext):
            raise ProblemError(
                403,
                "operator_key_not_allowed",
                "Insufficient scope",
                "an operator key acts for no tenant; use a tenant's key for /v1/exports "
                "and /v1/schedules (operators have /v1/admin)",
            )
        if not caller.has(scope):
            raise ProblemError(
                403,
                "insufficient_scope",
                "Insufficient scope",
                f"this operation needs the '{scope}' scope",
            )
        return caller

    return Depends(check)


async def _operator(caller: Caller) -> AuthContext:
    if not caller.is_operator:
        raise ProblemError(
            403,
            "operator_key_required",
            "Insufficient scope",
            "this operation needs an operator key (`exportctl operator-key create`); "
            "tenant keys never reach other tenants",
        )
    return caller


Writer = Annotated[TenantContext, require_scope("exports:write")]
Reader = Annotated[TenantContext, require_scope("exports:read")]
Operator = Annotated[AuthContext, Depends(_operator)]
"""The caller of an ``/v1/admin`` route: an operator key (kind ``operator``, no tenant), of
any role; reads need no more."""


def operator_may(action: str) -> object:
    """A dependency for an ``/v1/admin`` route that changes something: an operator key
    whose role allows ``action`` (:func:`exportcore.auth.authorize`, the one role check the
    console shares), else 403 ``role_insufficient`` before the route does anything."""

    async def check(caller: Operator) -> AuthContext:
        authorize(caller, action)
        return caller

    return Depends(check)


def actor_of(caller: AuthContext) -> Actor:
    """Who the audit trail names for this caller (:class:`exportcore.audit.Actor`)."""
    return Actor.of(caller)


def _refusal(decision: Decision, title: str, detail: str, after: str = "") -> ProblemError:
    """The 429 problem ``rate_limited`` of a refused bucket: ``Retry-After`` from the bucket
    (RFC 6585 section 4, RFC 9110 section 10.2.3) and ``retry_after`` to the millisecond."""
    return ProblemError(
        429,
        "rate_limited",
        title,
        f"{detail}; retry in {decision.retry_after:.2f} s{after}",
        headers={"Retry-After": decision.retry_after_header},
        retry_after=round(decision.retry_after, 3),
    )


def _submit_rate(request: Request, caller: Writer, settings: SettingsDep) -> Decision:
    """Take one token of the caller's tenant's submit bucket, or answer 429 with
    ``Retry-After`` from the bucket before anything is read or written in PostgreSQL
    (``exportcore.ratelimit``); the answer carries ``RateLimit-Policy`` and ``RateLimit``
    (:mod:`services.api.rate_headers`). For every submit a tenant drives: ``POST
    /v1/exports`` and a schedule's "run now"."""
    limits: TenantLimits = request.app.state.tenant_limits
    limiter: RateLimiter = request.app.state.rate_limiter
    limit = limits.of(caller.tenant_id)
    decision = limiter.check(caller.tenant_id, limit)
    rate_headers.remember(request, ratelimit.SUBMIT, decision)
    if not decision.allowed:
        metrics.SUBMITS.labels("rate_limited", "api").inc()
        metrics.TENANT_REFUSALS.labels(
            settings.tenant_label(caller.tenant_id), "rate_limited", "api"
        ).inc()
        raise _refusal(
            decision,
            "Submit rate exceeded",
            f"this tenant may submit {limit.rate:g} exports per second with bursts of "
            f"{limit.burst}",
            ". Nothing was accepted",
        )
    return decision


SubmitRateLimited = Annotated[Decision, Depends(_submit_rate)]


def rate_limited(request: Request, name: str, subject: str, limit: Limit, what: str) -> Decision:
    """Take one token of ``subject``'s bucket of the limit ``name``, or raise the 429
    problem ``rate_limited`` (:func:`_refusal`) before the route reads anything in
    PostgreSQL; either way the answer carries ``RateLimit-Policy`` and ``RateLimit``
    (:mod:`services.api.rate_headers`). ``what`` names the requests in the detail ("such
    reads", "webhook tests and redeliveries")."""
    limiter: RateLimiter = request.app.state.rate_limiter
    decision = limiter.check(subject, limit, name=name)
    rate_headers.remember(request, name, decision)
    if not decision.allowed:
        raise _refusal(
            decision,
            "Rate limit exceeded",
            f"this tenant may make {limit.rate:g} {what} per second with bursts of {limit.burst}",
        )
    return decision


def _read_rate(request: Request, caller: Reader, settings: SettingsDep) -> Decision:
    """The tenant's read limit (``TENANT_READ_RATE`` / ``TENANT_READ_BURST``) for the list,
    history and download endpoints: the reads that cost a page of rows or a file."""
    limit = Limit(settings.tenant_read_rate, settings.tenant_read_burst)
    return rate_limited(request, ratelimit.READ, caller.tenant_id, limit, "such reads")


def _webhook_action_rate(request: Request, caller: Writer, settings: SettingsDep) -> Decision:
    """The tenant's limit on webhook test messages, redeliveries and recovers
    (``WEBHOOK_ACTION_RATE`` / ``WEBHOOK_ACTION_BURST``, one token per request): each
    queues deliveries to a receiver, and a redelivery or a recover resets its messages'
    attempt budgets."""
    limit = Limit(settings.webhook_action_rate, settings.webhook_action_burst)
    return rate_limited(
        request,
        ratelimit.WEBHOOK_ACTION,
        caller.tenant_id,
        limit,
        "webhook tests, redeliveries and recovers",
    )


ReadRateLimited = Annotated[Decision, Depends(_read_rate)]
WebhookActionRateLimited = Annotated[Decision, Depends(_webhook_action_rate)]


def count_refusal(settings: Settings, tenant_id: str, exc: AdmissionRefused) -> None:
    """Count an admission refusal of a tenant's submit (``exports_tenant_refusals_total``)."""
    metrics.TENANT_REFUSALS.labels(settings.tenant_label(tenant_id), exc.code, "api").inc()
