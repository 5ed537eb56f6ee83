"""The Celery workers as the broker knows them (the console's workers page,
``GET /v1/admin/workers``, ``exportctl workers list``).

Two sources, both already there; nothing new is recorded for this:

- **the broker**: every running worker binds its remote-control mailbox (kombu's ``pidbox``
  fanout exchange, on Redis a member ``…<hostname>.celery.pidbox`` of the set
  ``_kombu.binding.celery.pidbox``) from start to clean shutdown. That set names the
  workers the broker knows, answering or not (a worker killed hard leaves its binding
  behind until the next one of that name starts);
- **the workers themselves**, through one remote-control broadcast of the inspect command
  ``exports_worker_state`` (:mod:`services.worker.remote_state`): queues, the export jobs
  in hand (running and reserved) and the last heartbeat of the worker's liveness file.

The broadcast waits at most ``timeout`` seconds (it returns as soon as every known worker
answered), and every Redis call is bounded by the same time, so a slow or unreachable
broker makes the page say so instead of hanging it: :class:`WorkersReport` then carries
``error`` and whatever was known.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis

from exportcore.broker import make_celery
from exportcore.settings import Settings

log = logging.getLogger(__name__)

COMMAND = "exports_worker_state"
"""The inspect command the workers answer (``services.worker.remote_state``)."""
PIDBOX_BINDINGS = "_kombu.binding.celery.pidbox"
PIDBOX_SUFFIX = ".celery.pidbox"
DEFAULT_TIMEOUT = 1.0
"""Seconds the broadcast waits for replies (and the bound of each Redis call)."""


@dataclass
class WorkerInfo:
    """One worker: its node name (``fast@host``), host, whether it answered the broadcast,
    its queues, the job ids it runs (``active_jobs``) and holds reserved, its pool size,
    its last heartbeat (liveness file's time, None without one) and that heartbeat's age
    in seconds at ``checked_at``."""

    name: str
    host: str
    answered: bool
    queues: list[str] = field(default_factory=list)
    active_jobs: list[str] = field(default_factory=list)
    reserved_jobs: list[str] = field(default_factory=list)
    concurrency: int | None = None
    pid: int | None = None
    heartbeat_at: datetime | None = None
    heartbeat_age_seconds: float | None = None
    liveness_file: bool | None = None

    @property
    def jobs_in_hand(self) -> int:
        """Running plus reserved export jobs."""
        return len(self.active_jobs) + len(self.reserved_jobs)

    def as_json(self) -> dict[str, Any]:
        """The worker as the API returns it (times in ISO 8601)."""
        out = asdict(self)
        out["heartbeat_at"] = self.heartbeat_at.isoformat() if self.heartbeat_at else None
        out["jobs_in_hand"] = self.jobs_in_hand
        return out


@dataclass
class WorkersReport:
    """Every worker known or answering at ``checked_at``; ``error`` when the broker could
    not be read in time (the list is then what was known before it failed)."""

    checked_at: datetime
    timeout_seconds: float
    workers: list[WorkerInfo]
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The report as the API returns it."""
        return {
            "checked_at": self.checked_at.isoformat(),
            "timeout_seconds": self.timeout_seconds,
            "error": self.error,
            "workers": [w.as_json() for w in self.workers],
        }


def _host(name: str) -> str:
    return name.split("@", 1)[1] if "@" in name else name


def known_workers(client: redis.Redis) -> set[str]:
    """Node names whose remote-control mailbox the broker holds (see the module docstring).
    Raises ``redis.RedisError``."""
    names: set[str] = set()
    for member in client.smembers(PIDBOX_BINDINGS):
        text = member.decode("utf-8", "replace") if isinstance(member, bytes) else str(member)
        queue = text.rsplit("\x06\x16", 1)[-1]
        if queue.endswith(PIDBOX_SUFFIX):
            names.add(queue[: -len(PIDBOX_SUFFIX)])
    return names


def list_workers(settings: Settings, *, timeout: float = DEFAULT_TIMEOUT) -> WorkersReport:
    """Ask the broker and the workers (at most ``timeout`` seconds of waiting for replies);
    never raises for a broker problem: the report's ``error`` says what failed."""
    now = datetime.now(UTC)
    known: set[str] = set()
    replies: dict[str, dict[str, Any]] = {}
    error: str | None = None
    client = redis.Redis.from_url(
        settings.broker_url, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    try:
        known = known_workers(client)
        app = make_celery(settings)
        app.conf.broker_transport_options = {
            **(app.conf.broker_transport_options or {}),
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
        }
        app.conf.broker_connection_retry = False
        app.conf.broker_connection_max_retries = 0
        with app.connection_for_write() as conn:
            answers = app.control.broadcast(
                COMMAND,
                reply=True,
                timeout=timeout,
                limit=len(known) or None,
                connection=conn,
            )
        for answer in answers or []:
            for name, body in answer.items():
                if isinstance(body, dict) and "error" not in body:
                    replies[name] = body
    except (redis.RedisError, OSError) as exc:
        error = f"the broker did not answer within {timeout:g} s: {type(exc).__name__}"
        log.warning("workers not listed", extra={"error": repr(exc)})
    finally:
        client.close()
    workers = [_worker(name, replies.get(name), now) for name in sorted(known | set(replies))]
    return WorkersReport(checked_at=now, timeout_seconds=timeout, workers=workers, error=error)


def _worker(name: str, body: dict[str, Any] | None, now: datetime) -> WorkerInfo:
    if body is None:
        return WorkerInfo(name=name, host=_host(name), answered=False)
    beat = body.get("heartbeat_at")
    at = datetime.fromisoformat(beat) if isinstance(beat, str) else None
    return WorkerInfo(
        name=name,
        host=_host(name),
        answered=True,
        queues=list(body.get("queues") or []),
        active_jobs=list(body.get("active_jobs") or []),
        reserved_jobs=list(body.get("reserved_jobs") or []),
        concurrency=body.get("concurrency"),
        pid=body.get("pid"),
        heartbeat_at=at,
        heartbeat_age_seconds=round((now - at).total_seconds(), 1) if at else None,
        liveness_file=body.get("liveness_file"),
    )
