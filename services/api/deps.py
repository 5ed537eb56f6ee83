"""FastAPI dependencies as typed aliases: settings, pool, artifact store, caller identity.

Dependencies that do no I/O are ``async`` so FastAPI runs them in the event loop: only the
API-key lookup (and the route itself) goes to a worker thread.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from psycopg_pool import ConnectionPool

from exportcore.artifacts import ArtifactStore
from exportcore.auth import AuthContext, authenticate
from exportcore.db import Conn
from exportcore.settings import Settings
from services.api.problems import ProblemError


async def _settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def _pool(request: Request) -> ConnectionPool[Conn]:
    return request.app.state.pool  # type: ignore[no-any-return]


async def _store(request: Request) -> ArtifactStore:
    return request.app.state.store  # type: ignore[no-any-return]


SettingsDep = Annotated[Settings, Depends(_settings)]
PoolDep = Annotated[ConnectionPool[Conn], Depends(_pool)]
StoreDep = Annotated[ArtifactStore, Depends(_store)]

_UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="notes-exports"'}


_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="apiKey",
    description="An API key from `exportctl apikey create`, sent as a bearer token.",
)


def _caller(
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
    with pool.connection() as conn:
        ctx = authenticate(conn, presented.strip())
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
    """A dependency that answers 403 unless the caller's key carries ``scope``."""

    async def check(caller: Caller) -> AuthContext:
        if not caller.has(scope):
            raise ProblemError(
                403,
                "insufficient_scope",
                "Insufficient scope",
                f"this operation needs the '{scope}' scope",
            )
        return caller

    return Depends(check)


Writer = Annotated[AuthContext, require_scope("exports:write")]
Reader = Annotated[AuthContext, require_scope("exports:read")]
Admin = Annotated[AuthContext, require_scope("admin")]
