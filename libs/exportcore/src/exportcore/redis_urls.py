"""Redis URLs and clients for the broker and the rate limiter: a plain Redis
(``redis://``, ``rediss://`` for TLS, ``unix://``) or a master found through Redis
Sentinel (``sentinel://host:port;sentinel://host:port…``, the form kombu's sentinel
transport takes), with an ACL user and password in the URL.

Every process that talks to Redis outside Celery (the rate limiter, the publisher's broker
window, the broker inspection) builds its client here, so that each one follows a
Sentinel failover to the new master exactly as the Celery transport does (redis-py's
``Sentinel.master_for``: the master is asked of the Sentinels again after a connection
error) and verifies TLS with the same CA bundle (``BROKER_TLS_CA_FILE``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import redis
from redis.sentinel import Sentinel

if TYPE_CHECKING:
    from exportcore.settings import Settings

SCHEMES = ("redis", "rediss", "unix", "sentinel")


@dataclass(frozen=True)
class RedisTarget:
    """A parsed Redis URL: ``sentinels`` ((host, port) of each Sentinel) is empty for a
    plain Redis; ``username``/``password`` are the Redis user's (the master's, behind
    Sentinels); ``db`` the logical database; ``tls`` for ``rediss://``."""

    url: str
    sentinels: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    db: int
    tls: bool


def parse_redis_url(url: str) -> RedisTarget:
    """Parse ``url``; raises ValueError saying what is wrong (never echoing a password).

    A Sentinel URL lists every Sentinel, each as ``sentinel://[user:password@]host:port[/db]``,
    joined by ``;``; the first carries the credentials and the database."""
    parts = [p.strip() for p in url.split(";") if p.strip()]
    if not parts:
        raise ValueError("a Redis URL is required (redis://host:port/db)")
    schemes = {urlsplit(p).scheme for p in parts}
    if not schemes <= set(SCHEMES):
        raise ValueError(
            f"unsupported Redis URL scheme {sorted(schemes - set(SCHEMES))}; use redis://, "
            "rediss:// (TLS), unix:// or sentinel://"
        )
    first = urlsplit(parts[0])
    if "sentinel" in schemes and schemes != {"sentinel"}:
        raise ValueError("a Sentinel URL lists only sentinel:// addresses, joined by ';'")
    if len(parts) > 1 and first.scheme != "sentinel":
        raise ValueError("only a sentinel:// URL may list several addresses (joined by ';')")
    try:
        if first.scheme != "unix":
            _ = first.port  # raises ValueError for a port that is not a number
        db = int((first.path or "/0").strip("/") or 0) if first.scheme != "unix" else 0
        sentinels = tuple(
            (s.hostname or "127.0.0.1", s.port or 26379)
            for s in map(urlsplit, parts)
            if s.scheme == "sentinel"
        )
    except ValueError:
        raise ValueError("a Redis URL names a numeric port and database (host:6379/0)") from None
    return RedisTarget(
        url=parts[0],
        sentinels=sentinels,
        username=unquote(first.username) if first.username else None,
        password=unquote(first.password) if first.password else None,
        db=db,
        tls=first.scheme == "rediss",
    )


def tls_options(settings: Settings) -> dict[str, Any]:
    """redis-py keyword arguments that verify a TLS server against ``BROKER_TLS_CA_FILE``
    (or the system's CAs): ``ssl_cert_reqs`` required, host names checked."""
    options: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    if settings.broker_tls_ca_file is not None:
        options["ssl_ca_certs"] = str(settings.broker_tls_ca_file)
    return options


def celery_ssl(settings: Settings) -> dict[str, Any] | None:
    """Celery's ``broker_use_ssl`` for a ``rediss://`` broker (Celery refuses one without
    ``ssl_cert_reqs``), else None."""
    if not parse_redis_url(settings.broker_url).tls:
        return None
    out: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    if settings.broker_tls_ca_file is not None:
        out["ssl_ca_certs"] = str(settings.broker_tls_ca_file)
    return out


def sentinel_transport_options(settings: Settings) -> dict[str, Any]:
    """The kombu transport options a ``sentinel://`` broker needs (``master_name`` and the
    Sentinels' own password), else {}."""
    if not parse_redis_url(settings.broker_url).sentinels:
        return {}
    timeout = settings.broker_publish_timeout
    sentinel_kwargs: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if settings.broker_sentinel_password is not None:
        sentinel_kwargs["password"] = settings.broker_sentinel_password.get_secret_value()
    return {"master_name": settings.broker_sentinel_master, "sentinel_kwargs": sentinel_kwargs}


def redis_client(
    settings: Settings, url: str, *, timeout: float, retry_on_timeout: bool = False
) -> redis.Redis:
    """A client of ``url``: of the master the Sentinels name (``BROKER_SENTINEL_MASTER``;
    found again after a failover), or of the one Redis. ``timeout`` bounds every connect
    and socket read (seconds)."""
    target = parse_redis_url(url)
    common: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry_on_timeout": retry_on_timeout,
    }
    if not target.sentinels:
        extra = tls_options(settings) if target.tls else {}
        return redis.Redis.from_url(url, **common, **extra)
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
    }
    if settings.broker_sentinel_password is not None:
        sentinel_kwargs["password"] = settings.broker_sentinel_password.get_secret_value()
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels), sentinel_kwargs=sentinel_kwargs, **common
    )
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        settings.broker_sentinel_master,
        redis_class=redis.Redis,
        username=target.username,
        password=target.password,
        db=target.db,
    )
    return client
