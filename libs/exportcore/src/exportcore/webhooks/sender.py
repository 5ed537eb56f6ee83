"""One webhook attempt over HTTP: resolve once, check the address, connect to that address,
POST the signed body, never follow a redirect, and end by the attempt's deadline.

The connection goes to the address :func:`~exportcore.webhooks.netguard.resolve_target`
checked (the request URL carries the IP literal), so nothing resolves the name a second
time between the check and the connect. The endpoint's own name is kept where it matters:
the ``Host`` header, and for https the TLS server name (SNI) and the certificate check,
through httpcore's ``sni_hostname`` request extension. Proxies from the environment are
never used: a proxy would connect to a name of its own choosing.

An attempt has a wall-clock deadline, ``WEBHOOK_TIMEOUT_SECONDS`` after it starts, that
covers name resolution, connect, TLS, sending, the answer's headers and its body
(:mod:`exportcore.webhooks.attempt_deadline`): a receiver that trickles its answer a byte at
a time is cut off at the deadline (outcome ``timeout``) and frees its sender thread. The
request goes through httpcore (the engine under httpx) because httpx only bounds each
socket operation, not the request.

Each endpoint gets its own connection pool (at most ``WEBHOOK_ENDPOINT_CONCURRENCY``
connections), so a TLS connection verified for one host name is never reused for another
name that happens to resolve to the same address.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import httpcore

from exportcore.settings import Settings
from exportcore.webhooks import attempt_deadline, netguard, policy
from exportcore.webhooks.signing import webhook_headers

log = logging.getLogger(__name__)

USER_AGENT = "notes-exports-webhooks/0.1 (Standard Webhooks)"
MAX_RESPONSE_BYTES = 64 * 1024  # read (and drop) at most this much of an answer
MAX_CLIENTS = 256  # connection pools kept (least recently used endpoints are closed first)


@dataclass(frozen=True)
class Delivery:
    """Everything one attempt needs: the claimed message and its endpoint.

    ``signing_secrets`` are the endpoint's valid secrets, the current one first; ``body``
    is the exact text to send (:func:`~exportcore.webhooks.events.render_body`)."""

    message_id: UUID
    webhook_id: str
    endpoint_id: UUID
    url: str
    body: str
    signing_secrets: tuple[str, ...]
    attempt: int
    budget_used: int
    redelivery: bool
    claim_token: UUID
    event_type: str
    created_at: datetime


@dataclass(frozen=True)
class AttemptResult:
    """What one attempt did: ``outcome`` (``policy.OUTCOMES``), the HTTP status when an
    answer came, latency in milliseconds (request start to answer, or to the error), the
    address connected to, an error text without the URL's path or query, and the seconds
    of a ``Retry-After`` header."""

    delivery: Delivery
    started_at: datetime
    outcome: str
    status_code: int | None
    latency_ms: float
    address: str | None
    error: str | None
    retry_after: float | None
    signatures: int


class Sender:
    """Sends attempts; thread-safe (one instance serves every sender thread)."""

    def __init__(
        self,
        settings: Settings,
        *,
        resolver: netguard.Resolver | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.allow_http = settings.webhook_allow_http
        self.allow_private = settings.webhook_allow_private_networks
        self.timeout = settings.webhook_timeout_seconds
        self.pool_size = settings.webhook_endpoint_concurrency
        self.resolver = resolver
        # the system trust store (honours SSL_CERT_FILE / SSL_CERT_DIR), hostname checks on
        self.ssl_context = ssl_context or ssl.create_default_context()
        self._backend = attempt_deadline.DeadlineBackend()
        self._clients: OrderedDict[tuple[UUID, str, int], httpcore.ConnectionPool] = OrderedDict()
        self._lock = threading.Lock()

    def _client(self, endpoint_id: UUID, parsed: netguard.WebhookUrl) -> httpcore.ConnectionPool:
        key = (endpoint_id, parsed.host, parsed.port)
        with self._lock:
            client = self._clients.get(key)
            if client is not None:
                self._clients.move_to_end(key)
                return client
            client = httpcore.ConnectionPool(
                ssl_context=self.ssl_context,
                max_connections=self.pool_size,
                max_keepalive_connections=self.pool_size,
                keepalive_expiry=30.0,
                network_backend=self._backend,
            )
            self._clients[key] = client
            while len(self._clients) > MAX_CLIENTS:
                _, old = self._clients.popitem(last=False)
                old.close()
            return client

    def close(self) -> None:
        """Close every connection pool."""
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for client in clients:
            client.close()

    def _resolve(self, host: str, port: int, **kwargs: Any) -> Any:
        resolver = self.resolver or socket.getaddrinfo
        return attempt_deadline.resolve_within(resolver, host, port, **kwargs)

    def send(self, delivery: Delivery) -> AttemptResult:
        """Make one attempt; never raises for anything the network or the receiver does.
        Returns by the attempt's deadline (``WEBHOOK_TIMEOUT_SECONDS`` from its start)
        whatever the receiver does."""
        started_at = datetime.now(UTC)
        t0 = time.monotonic()
        with attempt_deadline.attempt(t0 + self.timeout):
            return self._send(delivery, started_at, t0)

    def _send(self, delivery: Delivery, started_at: datetime, t0: float) -> AttemptResult:
        timestamp = int(time.time())
        headers = webhook_headers(
            delivery.webhook_id, timestamp, delivery.body, delivery.signing_secrets
        )
        address: str | None = None

        def result(
            outcome: str,
            status: int | None = None,
            error: str | None = None,
            retry_after: float | None = None,
        ) -> AttemptResult:
            return AttemptResult(
                delivery=delivery,
                started_at=started_at,
                outcome=outcome,
                status_code=status,
                latency_ms=(time.monotonic() - t0) * 1000.0,
                address=address,
                error=error[:500] if error else None,
                retry_after=retry_after,
                signatures=len(delivery.signing_secrets),
            )

        try:
            parsed = netguard.parse_url(delivery.url)
            if parsed.scheme == "http" and not self.allow_http:
                return result(policy.REFUSED, error="plain http is refused (WEBHOOK_ALLOW_HTTP)")
            ip = netguard.resolve_target(
                parsed, allow_private=self.allow_private, resolver=self._resolve
            )
        except attempt_deadline.AttemptDeadlineExceeded as exc:
            return result(policy.TIMEOUT, error=f"{type(exc).__name__}: {exc}")
        except netguard.RefusedAddress as exc:
            if len(exc.args) > 1:
                log.warning(
                    "webhook address refused",
                    extra={
                        "endpoint_id": str(delivery.endpoint_id),
                        "message_id": delivery.webhook_id,
                        "address": str(exc.args[1]),
                    },
                )
            return result(policy.REFUSED, error=str(exc.args[0]))
        except netguard.InvalidWebhookUrl as exc:
            return result(policy.REFUSED, error=str(exc))
        address = str(ip)
        body = delivery.body.encode("utf-8")
        headers["host"] = parsed.host_header
        headers["user-agent"] = USER_AGENT
        headers["content-length"] = str(len(body))
        connect = min(self.timeout, 5.0)
        extensions: dict[str, Any] = {
            "timeout": {
                "connect": connect,
                "read": self.timeout,
                "write": self.timeout,
                "pool": self.timeout,
            },
        }
        if parsed.scheme == "https" and netguard.literal_address(parsed.host) is None:
            extensions["sni_hostname"] = parsed.host
        url = httpcore.URL(
            scheme=parsed.scheme.encode("ascii"),
            host=address.encode("ascii"),
            port=parsed.port,
            target=parsed.target.encode("ascii"),
        )
        try:
            client = self._client(delivery.endpoint_id, parsed)
            with client.stream(
                "POST", url, headers=list(headers.items()), content=body, extensions=extensions
            ) as response:
                status = response.status
                answer = {k.decode("latin-1").lower(): v for k, v in response.headers}
                retry_after = policy.parse_retry_after(
                    answer.get("retry-after", b"").decode("latin-1") or None, datetime.now(UTC)
                )
                read = 0
                for chunk in response.iter_stream():
                    read += len(chunk)
                    if read >= MAX_RESPONSE_BYTES:
                        break
        except httpcore.TimeoutException as exc:
            return result(policy.TIMEOUT, error=self._error(exc, parsed))
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            return result(policy.CONNECTION_ERROR, error=self._error(exc, parsed))
        except (OSError, ssl.SSLError) as exc:  # raised outside httpcore's own mapping
            return result(policy.CONNECTION_ERROR, error=self._error(exc, parsed))
        outcome = policy.outcome_of_status(status)
        error = None
        if outcome == policy.REDIRECT:
            error = f"HTTP {status}: redirects are not followed; register the final URL"
        elif outcome != policy.DELIVERED:
            error = f"HTTP {status}"
        return result(outcome, status, error, retry_after if status in policy.THROTTLING else None)

    @staticmethod
    def _error(exc: BaseException, parsed: netguard.WebhookUrl) -> str:
        text = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        if len(parsed.target) > 1:
            text = text.replace(parsed.target, "/…")
        return text
