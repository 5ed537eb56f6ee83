"""What the broker holds, reconciled against PostgreSQL (``exportctl broker inspect`` and the
recovery-scanner's ``exports_broker_*`` gauges).

Celery's Redis transport (kombu ``kombu.transport.redis``) keeps, per queue, one list per
priority step (``<queue>``, ``<queue>\\x06\\x163`` …; ``Channel.sep`` and
``PRIORITY_STEPS``), new messages pushed on the left and consumed from the right; and, for
messages delivered to a consumer but not acknowledged yet, one hash ``unacked`` (delivery
tag → ``[message, exchange, routing key]``) with a sorted set ``unacked_index`` (delivery
tag → delivery time, Unix seconds), from which kombu restores messages older than the
visibility timeout. Key names come from kombu's ``Channel`` class, not from copies here.

A message of ours carries job ids only: one (``EXPORT_TASK``, ``args=[job_id]``) or, for
small jobs the publisher sends together, several (``EXPORT_BATCH_TASK``, ``args=[[job_id,
…], [event id, …]]``); its task id is the (first) outbox event id. So every message can be
checked against the jobs it names:

- ``stale``: every job it names is terminal (succeeded, failed or cancelled) or gone, and
  at least one is known: a worker would only refuse it. ``purge_stale`` removes exactly
  these, and nothing else (a message naming one live job is live);
- ``unknown``: no job it names exists (pruned, or not ours): reported, never removed;
- ``lost`` (from the other side): queued jobs whose message was sent (no unsent outbox
  event) but that no message in Redis names: the recovery-scanner re-dispatches them after
  ``DISPATCH_THRESHOLD_SECONDS``.

Reading is race-tolerant rather than atomic: the queued jobs are read before and after
Redis, and a job is ``lost`` only when both reads list it unchanged and no message names it.
Everything is read-only unless ``purge_stale`` is asked for. The recovery-scanner serves a
report as gauges through :class:`exportcore.metrics.BrokerGauges`.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from uuid import UUID

import redis
from kombu.transport.redis import PRIORITY_STEPS
from kombu.transport.redis import Channel as RedisChannel
from psycopg_pool import ConnectionPool

from exportcore.broker import EXPORT_BATCH_TASK, EXPORT_TASK, TICK_TASK, make_celery
from exportcore.db import Conn, transaction
from exportcore.domain import QUEUES, TERMINAL_STATES
from exportcore.redis_urls import redis_client
from exportcore.settings import Settings
from exportcore.store import broker as broker_store

log = logging.getLogger(__name__)

INSPECT_LIMIT = 10_000
"""Ready messages read per queue by default (counts stay exact; the reconciliation covers
the oldest this many)."""

MessageState = Literal["ready", "unacked"]
Verdict = Literal["live", "stale", "unknown", "tick", "unreadable"]


@dataclass
class Message:
    """One message as found in Redis.

    ``key`` is the list (ready) it sits in, ``tag`` its delivery tag (unacked), ``raw`` the
    exact bytes stored (what a purge compares before removing), ``age`` seconds since it
    was sent (ready: from its outbox event; unacked: since delivery), ``verdict`` what the
    reconciliation made of it and ``job_status`` the status of the job it names.
    ``job_ids`` are all the jobs a message names (one, or several for a batch message);
    ``job_id`` is the first of them.
    """

    queue: str
    state: MessageState
    raw: bytes
    key: str | None = None
    tag: str | None = None
    task: str | None = None
    task_id: str | None = None
    job_id: UUID | None = None
    job_ids: tuple[UUID, ...] = ()
    age: float | None = None
    verdict: Verdict = "live"
    job_status: str | None = None


@dataclass
class QueueReport:
    """Per queue: messages ready and unacked (exact counts), the oldest age of each
    (seconds, None when unknown or empty), how many ready messages were read
    (``inspected_ready``; at most the limit), and the reconciliation counts."""

    queue: str
    ready: int = 0
    unacked: int = 0
    oldest_ready_age: float | None = None
    oldest_unacked_age: float | None = None
    inspected_ready: int = 0
    stale: int = 0
    unknown: int = 0
    unreadable: int = 0
    lost: int = 0


@dataclass
class BrokerReport:
    """The whole picture: per queue counts, the messages found stale or unknown, the lost
    jobs, whether ready lists were longer than the limit (``truncated``), and what a purge
    removed (``purged``: ready and unacked counts; None when not asked)."""

    queues: dict[str, QueueReport]
    stale: list[Message] = field(default_factory=list)
    unknown: list[Message] = field(default_factory=list)
    unreadable: list[Message] = field(default_factory=list)
    lost: list[dict[str, Any]] = field(default_factory=list)
    oldest_unacked_age: float | None = None
    truncated: bool = False
    purged: dict[str, int] | None = None

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (messages without their raw bytes)."""

        def message(m: Message) -> dict[str, Any]:
            d = asdict(m)
            d.pop("raw")
            return {k: (str(v) if isinstance(v, UUID) else v) for k, v in d.items()}

        return {
            "queues": {name: asdict(q) for name, q in self.queues.items()},
            "oldest_unacked_age": self.oldest_unacked_age,
            "stale": [message(m) for m in self.stale],
            "unknown": [message(m) for m in self.unknown],
            "unreadable": [message(m) for m in self.unreadable],
            "lost": [
                {k: (str(v) if isinstance(v, UUID) else v) for k, v in row.items()}
                for row in self.lost
            ],
            "truncated": self.truncated,
            "purged": self.purged,
        }


class BrokerKeys:
    """The Redis key names of kombu's transport, read from its ``Channel`` class and the
    broker's transport options (``global_keyprefix`` when configured)."""

    def __init__(self, transport_options: dict[str, Any] | None = None) -> None:
        prefix = str((transport_options or {}).get("global_keyprefix", "") or "")
        self.prefix = prefix
        self.unacked = prefix + RedisChannel.unacked_key
        self.unacked_index = prefix + RedisChannel.unacked_index_key
        self.sep = RedisChannel.sep

    def lists(self, queue: str) -> list[str]:
        """The list of each priority step of ``queue``, highest priority first
        (kombu ``Channel._q_for_pri``: step 0 is the bare name)."""
        names = [f"{queue}{self.sep}{step}" if step else queue for step in sorted(PRIORITY_STEPS)]
        return [self.prefix + n for n in names]


def parse_message(queue: str, state: MessageState, raw: bytes) -> Message:
    """Decode a kombu message envelope (JSON; body base64 when ``body_encoding`` says so;
    Celery protocol 2 body ``[args, kwargs, embed]``). Anything that does not decode is
    ``unreadable`` (never removed)."""
    msg = Message(queue=queue, state=state, raw=raw)
    try:
        envelope = json.loads(raw)
        headers = envelope.get("headers") or {}
        msg.task = headers.get("task")
        msg.task_id = headers.get("id")
        if msg.task == TICK_TASK:
            msg.verdict = "tick"
            return msg
        body = envelope["body"]
        if (envelope.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        if msg.task == EXPORT_TASK and args:
            msg.job_ids = (UUID(str(args[0])),)
        elif msg.task == EXPORT_BATCH_TASK and args and isinstance(args[0], list) and args[0]:
            msg.job_ids = tuple(UUID(str(j)) for j in args[0])
        else:
            raise ValueError("not an export task")
        msg.job_id = msg.job_ids[0]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        msg.verdict = "unreadable"
    return msg


def _uuid(value: str | None) -> UUID | None:
    try:
        return UUID(str(value)) if value else None
    except ValueError:
        return None


class BrokerInspector:
    """Reads the broker and reconciles it with PostgreSQL; see the module docstring.

    ``limit`` bounds the ready messages read per queue (counts stay exact; the
    reconciliation then covers the oldest ``limit``); ``grace_seconds`` is how long after
    a dispatch a job without a visible message is still given (a message in flight between
    the publisher, Redis and a worker); ``timeout_ms`` bounds each database read (the
    scrape-time gauges use ``METRICS_DB_TIMEOUT_MS``; None: the pool's statement timeout).
    """

    def __init__(
        self,
        client: redis.Redis,
        pool: ConnectionPool[Conn],
        *,
        queues: tuple[str, ...] = QUEUES,
        limit: int = INSPECT_LIMIT,
        grace_seconds: float = 5.0,
        keys: BrokerKeys | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        self.client = client
        self.timeout_ms = timeout_ms
        self.pool = pool
        self.queues = queues
        self.limit = limit
        self.grace_seconds = grace_seconds
        self.keys = keys or BrokerKeys()

    @classmethod
    def from_settings(
        cls, settings: Settings, pool: ConnectionPool[Conn], *, timeout_ms: int | None = None
    ) -> BrokerInspector:
        """An inspector on the settings' broker URL (socket timeouts from
        BROKER_PUBLISH_TIMEOUT) and its transport options (``global_keyprefix``), reading at
        most ``INSPECT_LIMIT`` ready messages per queue."""
        client = redis_client(
            settings, settings.broker_url, timeout=settings.broker_publish_timeout
        )
        options = make_celery(settings).conf.broker_transport_options
        return cls(
            client,
            pool,
            keys=BrokerKeys(options),
            timeout_ms=timeout_ms,
        )

    @contextmanager
    def _db(self) -> Iterator[Conn]:
        """One read-only transaction, its statements bounded by ``timeout_ms``."""
        with transaction(self.pool) as conn:
            if self.timeout_ms:
                conn.execute(
                    "SELECT set_config('statement_timeout', %s, true)", (str(self.timeout_ms),)
                )
            yield conn

    def inspect(self, *, purge_stale: bool = False) -> BrokerReport:
        """Read, reconcile and (only with ``purge_stale``) remove the messages of terminal
        jobs. Raises ``redis.RedisError`` or ``psycopg.Error`` when a side is unreachable."""
        before = self._queued_without_pending()
        report, messages = self._read()
        self._reconcile(report, messages)
        after = self._queued_without_pending()
        named = {j for m in messages for j in m.job_ids}
        for job_id, row in after.items():
            earlier = before.get(job_id)
            if job_id in named or earlier is None:
                continue
            if earlier["dispatch_count"] != row["dispatch_count"]:
                continue  # re-dispatched in between: its message may be on its way
            report.lost.append(row)
            if row["queue"] in report.queues:
                report.queues[row["queue"]].lost += 1
        if purge_stale:
            report.purged = self._purge(report.stale)
        return report

    # --- reading ---------------------------------------------------------------------------

    def _read(self) -> tuple[BrokerReport, list[Message]]:
        report = BrokerReport(queues={q: QueueReport(queue=q) for q in self.queues})
        messages: list[Message] = []
        now = time.time()
        pipe = self.client.pipeline(transaction=False)
        for queue in self.queues:
            for key in self.keys.lists(queue):
                pipe.llen(key)
                # the right end is consumed first: read the oldest `limit` messages
                pipe.lrange(key, -self.limit, -1)
        pipe.hgetall(self.keys.unacked)
        pipe.zrange(self.keys.unacked_index, 0, -1, withscores=True)
        results = pipe.execute()
        i = 0
        for queue in self.queues:
            q = report.queues[queue]
            for key in self.keys.lists(queue):
                length, raws = results[i], results[i + 1]
                i += 2
                q.ready += int(length)
                q.inspected_ready += len(raws)
                report.truncated |= int(length) > len(raws)
                for raw in raws:
                    m = parse_message(queue, "ready", raw)
                    m.key = key
                    messages.append(m)
        unacked: dict[bytes, bytes] = results[i]
        delivered = {tag.decode(): score for tag, score in results[i + 1]}
        for tag_b, value in unacked.items():
            tag = tag_b.decode()
            try:
                payload, _exchange, routing_key = json.loads(value)
                raw = json.dumps(payload).encode()
                queue = str(routing_key)
            except (ValueError, TypeError):
                payload, raw, queue = None, value, "unknown"
            q = report.queues.setdefault(queue, QueueReport(queue=queue))
            q.unacked += 1
            m = (
                parse_message(queue, "unacked", raw)
                if payload is not None
                else Message(queue=queue, state="unacked", raw=raw, verdict="unreadable")
            )
            m.tag, m.raw = tag, value
            if tag in delivered:
                m.age = max(0.0, now - delivered[tag])
            messages.append(m)
        return report, messages

    def _queued_without_pending(self) -> dict[UUID, dict[str, Any]]:
        with self._db() as conn:
            rows = broker_store.broker_queued_without_pending_event(
                conn, grace_seconds=self.grace_seconds, limit=self.limit
            )
        return {r["id"]: dict(r) for r in rows}

    # --- reconciling -----------------------------------------------------------------------

    def _reconcile(self, report: BrokerReport, messages: list[Message]) -> None:
        job_ids = sorted({j for m in messages for j in m.job_ids})
        ready_ids = sorted(
            {u for m in messages if m.state == "ready" and (u := _uuid(m.task_id)) is not None}
        )
        with self._db() as conn:
            jobs = {r["id"]: r for r in broker_store.broker_jobs_by_id(conn, job_ids=job_ids)}
            ages = {
                r["id"]: r["age"]
                for r in broker_store.broker_sent_ages(conn, message_ids=ready_ids)
            }
        for m in messages:
            q = report.queues[m.queue]
            if m.state == "ready":
                m.age = ages.get(_uuid(m.task_id)) if m.task_id else None
            age_field = "oldest_ready_age" if m.state == "ready" else "oldest_unacked_age"
            if m.age is not None and (getattr(q, age_field) or 0.0) < m.age:
                setattr(q, age_field, m.age)
            if m.state == "unacked" and m.age is not None:
                report.oldest_unacked_age = max(report.oldest_unacked_age or 0.0, m.age)
            if m.verdict == "unreadable":
                q.unreadable += 1
                report.unreadable.append(m)
                continue
            if not m.job_ids:
                continue  # a tick
            known = [job for j in m.job_ids if (job := jobs.get(j)) is not None]
            if not known:
                m.verdict = "unknown"
                q.unknown += 1
                report.unknown.append(m)
                continue
            live = [job for job in known if job["status"] not in TERMINAL_STATES]
            # the first live job names the message's status; with none, the first known
            m.job_id = (live or known)[0]["id"]
            m.job_status = (live or known)[0]["status"]
            if not live:
                m.verdict = "stale"
                q.stale += 1
                report.stale.append(m)

    # --- purging ---------------------------------------------------------------------------

    def _purge(self, stale: list[Message]) -> dict[str, int]:
        """Remove the messages of terminal jobs: a ready message by its exact bytes
        (``LREM``; gone already → nothing), an unacked one only while the hash still holds
        the same bytes for its tag (``WATCH`` / ``MULTI``), with its index entry."""
        removed = {"ready": 0, "unacked": 0}
        for m in stale:
            if m.job_status not in TERMINAL_STATES:  # never anything else
                continue
            if m.state == "ready" and m.key is not None:
                # redis-py sends bytes as they are (its stubs say str)
                removed["ready"] += int(self.client.lrem(m.key, 1, m.raw))  # type: ignore[arg-type]
            elif m.state == "unacked" and m.tag is not None:
                removed["unacked"] += self._drop_unacked(m.tag, m.raw)
        log.info("stale broker messages purged", extra=removed)
        return removed

    def _drop_unacked(self, tag: str, raw: bytes) -> int:
        with self.client.pipeline() as pipe:
            try:
                pipe.watch(self.keys.unacked)  # type: ignore[no-untyped-call]
                if pipe.hget(self.keys.unacked, tag) != raw:
                    pipe.unwatch()
                    return 0  # acknowledged or restored meanwhile
                pipe.multi()
                pipe.zrem(self.keys.unacked_index, tag)
                pipe.hdel(self.keys.unacked, tag)
                return int(pipe.execute()[-1])
            except redis.WatchError:
                return 0  # the hash changed under us: leave it for the next run
