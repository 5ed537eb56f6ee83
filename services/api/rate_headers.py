"""``RateLimit-Policy`` and ``RateLimit`` on every answer of a rate-limited request, so a
client learns its limit before a 429, not from one (IETF HTTPAPI draft "RateLimit header
fields for HTTP", draft-ietf-httpapi-ratelimit-headers-10 and later: both fields are
structured-field Lists, RFC 9651, written with the ``http-sf`` library).

Written from the :class:`exportcore.ratelimit.Decision` the limiter decided the request by
(no second call to Redis): the route's rate-limit dependency (or the console's sign-in)
calls :func:`remember`, and :class:`RateLimitHeaders` adds the fields to the response's
start, whatever answers — the route, a problem handler, the 429 refusal itself, or the 500
of an unhandled error. A request refused before the limiter (a missing or unknown key: a
401) carries neither field, so nobody learns another tenant's bucket (the draft's "Information
disclosure").

A token bucket (``rate`` tokens per second, at most ``burst``) in the draft's terms:

- ``RateLimit-Policy: "<limit>";q=<burst>;w=<window>``: a quota of ``burst`` requests
  over ``window`` = the seconds an empty bucket takes to fill again (``burst / rate``
  rounded up to a whole second, at least 1): the average rate it states is never above
  the real one.
- ``RateLimit: "<limit>";r=<remaining>;t=<seconds>``: ``r`` the whole tokens left after
  this request; ``t`` the seconds until the bucket holds one more whole token (rounded up),
  left out when the bucket is full. On a 429, ``r=0`` and ``t`` equals ``Retry-After``
  (the draft: ``Retry-After`` SHOULD NOT be earlier than ``t``).

``<limit>`` is the limit's name (``submit``, ``read``, ``webhook-action``,
``console-sign-in``; docs/limits.md). While Redis is unreachable the local share of the
limit decides, and the fields describe that share (the draft lets a server lower the
advertised values).
"""

from __future__ import annotations

import math

import http_sf
from fastapi import Request
from http_sf.types import ParamsType
from starlette.datastructures import MutableHeaders
from starlette.types import Message, Receive, Scope, Send

from exportcore.ratelimit import Decision, Limit
from services.api.asgi import HTTPMiddleware, WatchedSend

POLICY_FIELD = "RateLimit-Policy"
FIELD = "RateLimit"
_STATE = "rate_limit"


def window(limit: Limit) -> int:
    """The policy's window ``w`` in whole seconds: the time an empty bucket takes to fill
    (``burst / rate``), rounded up, at least 1 (the draft: a positive integer)."""
    return max(1, math.ceil(limit.burst / limit.rate))


def policy_value(name: str, limit: Limit) -> str:
    """The ``RateLimit-Policy`` value of the limit ``name``: ``"<name>";q=<burst>;w=<s>``."""
    params: ParamsType = {"q": limit.burst, "w": window(limit)}
    return http_sf.ser([(name, params)])


def service_value(name: str, decision: Decision) -> str:
    """The ``RateLimit`` value of ``decision`` under the limit ``name``:
    ``"<name>";r=<whole tokens left>;t=<s>`` (``t`` left out while the bucket is full;
    on a refusal ``t`` is ``Retry-After``'s value)."""
    limit = decision.limit
    remaining = max(0.0, decision.remaining)
    whole = math.floor(remaining)
    params: ParamsType = {"r": whole}
    if not decision.allowed:
        params["t"] = int(decision.retry_after_header)
    elif remaining < limit.burst:
        next_unit = min(whole + 1, limit.burst)
        params["t"] = max(1, math.ceil((next_unit - remaining) / limit.rate))
    return http_sf.ser([(name, params)])


def remember(request: Request, name: str, decision: Decision) -> None:
    """Record the decision of the limit ``name`` for this request's answer (the request's
    state, which the middleware reads when the response starts)."""
    setattr(request.state, _STATE, (name, decision))


class RateLimitHeaders(HTTPMiddleware):
    """ASGI middleware: ``RateLimit-Policy`` and ``RateLimit`` on the answer of every
    request a limiter decided (:func:`remember`), whatever its status."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request, adding the fields to its response start."""

        def add_fields(start: Message) -> None:
            state = scope.get("state")
            entry = state.get(_STATE) if isinstance(state, dict) else None
            if entry is None:
                return
            name, decision = entry
            headers = MutableHeaders(scope=start)
            headers[POLICY_FIELD] = policy_value(name, decision.limit)
            headers[FIELD] = service_value(name, decision)

        await self.app(scope, receive, WatchedSend(send, on_start=add_fields))
