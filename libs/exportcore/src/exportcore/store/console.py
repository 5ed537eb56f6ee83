"""The operator console's reads (``sql/console.sql``, and the dead-letter listing of
``sql/dead_letters.sql``) and its sessions (``sql/console_sessions.sql``). Its actions go
through the library (:mod:`exportcore.replays`, :mod:`exportcore.schedules`,
:mod:`exportcore.submit`), never through statements of its own.

The reads are executed unprepared (``prepare=False``): their optional filters are written
``(%(x)s IS NULL OR col = %(x)s)``, which PostgreSQL folds away only when it plans the
statement with the actual values. psycopg prepares a statement after a few executions, and
PostgreSQL may then switch to a generic plan that cannot use the index a filter needs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, LiteralString
from uuid import UUID

from psycopg.types.json import Jsonb

from exportcore.db import Conn, Row
from exportcore.sql import q


def _rows(
    conn: Conn, name: LiteralString, params: dict[str, Any], aggregate: LiteralString = "console"
) -> list[Row]:
    return conn.execute(q(aggregate, name), params, prepare=False).fetchall()


def _row(conn: Conn, name: LiteralString, params: dict[str, Any]) -> Row | None:
    return conn.execute(q("console", name), params, prepare=False).fetchone()


# --- overview ------------------------------------------------------------------------------


def queue_counts(conn: Conn) -> list[Row]:
    """Per queue: ``queued``, ``waiting_retry`` (queued, not yet due), ``running``,
    ``expired_leases`` (running past the lease)."""
    return _rows(conn, "console_queue_counts", {})


def finished_by_minute(conn: Conn, *, minutes: int) -> list[Row]:
    """Per minute (``minute``, UTC, truncated) and queue over the last ``minutes`` minutes
    (the current one included): ``succeeded``, ``failed``, ``cancelled`` counts."""
    return _rows(conn, "console_finished_by_minute", {"minutes": minutes})


def open_dead_letters(conn: Conn) -> int:
    """How many dead letters are in state ``open`` (neither replayed nor resolved)."""
    row = _row(conn, "console_open_dead_letters", {})
    return int(row["open"]) if row else 0


# --- jobs -----------------------------------------------------------------------------------


def jobs_page(
    conn: Conn,
    *,
    limit: int,
    status: str | None = None,
    queue: str | None = None,
    tenant_id: str | None = None,
    error_code: str | None = None,
    created_from: datetime | None = None,
    created_to: datetime | None = None,
    labels: dict[str, Any] | None = None,
    before: tuple[datetime, UUID] | None = None,
) -> list[Row]:
    """Up to ``limit`` jobs, newest first, strictly after the keyset cursor ``before``
    (``(created_at, id)`` of the previous page's last row); ``created_from`` inclusive,
    ``created_to`` exclusive; ``labels`` (:func:`exportcore.domain.labels_filter`): only
    the jobs that carry all of it. Each row has the job's list columns, ``labels`` (the
    job's ``{"metadata", "tags"}``, None without) and ``progress`` (rows rendered at the
    last renewal of a running job, else None)."""
    return _rows(
        conn,
        "console_jobs_page",
        {
            "limit": limit,
            "status": status,
            "queue": queue,
            "tenant_id": tenant_id,
            "error_code": error_code,
            "created_from": created_from,
            "created_to": created_to,
            "labels": Jsonb(labels) if labels else None,
            "before_created_at": before[0] if before else None,
            "before_id": before[1] if before else None,
        },
    )


def job(conn: Conn, *, job_id: UUID) -> Row | None:
    """The job (every column) with ``lease_valid``, its dead letter (``dead_letter_*``, with
    ``dead_letter_state``; who asked for its replay and when: ``replay_requested_by``,
    ``replayed_at``; its resolution: ``resolved_by``, ``resolved_at``, ``resolution_note``),
    the schedule slot that created it (``schedule_id``, ``scheduled_at``,
    ``schedule_trigger``) and ``progress``; None if unknown."""
    return _row(conn, "console_job", {"job_id": job_id})


def job_events(conn: Conn, *, job_id: UUID, limit: int) -> list[Row]:
    """The job's history, oldest first, at most ``limit`` events."""
    return _rows(conn, "console_job_events", {"job_id": job_id, "limit": limit})


def replay_chain(conn: Conn, *, job_id: UUID, max_depth: int = 50) -> list[Row]:
    """The job's replay ancestry (``depth`` -1 = the job it replays, -2 = that one's
    original...) and its replays (``depth`` 1, 2... for replays of replays), up to
    ``max_depth`` hops each way, with each job's status, error code and times."""
    return _rows(conn, "console_replay_chain", {"job_id": job_id, "max_depth": max_depth})


# --- dead letters -----------------------------------------------------------------------------


def dead_letter_groups(conn: Conn, *, reason: str | None = None) -> list[Row]:
    """Per ``reason`` (only ``reason`` when given): ``total``, ``open``, ``replayed``,
    ``resolved``, ``tenants`` and the ``newest`` dead letter's time; most open first."""
    return _rows(conn, "console_dead_letter_groups", {"reason": reason})


def dead_letters_page(
    conn: Conn,
    *,
    reason: str,
    limit: int,
    before: int | None,
    state: str | None = None,
    tenant_id: str | None = None,
) -> list[Row]:
    """One reason's dead letters with id < ``before``, newest first, optionally of one
    ``state`` and tenant: the admin API's listing (``dead_letters_page`` of
    ``sql/dead_letters.sql``, with state, replay and resolution), run unprepared so that
    each filter plans onto its index."""
    return _rows(
        conn,
        "dead_letters_page",
        {
            "reason": reason,
            "limit": limit,
            "before": before,
            "state": state,
            "tenant_id": tenant_id,
        },
        aggregate="dead_letters",
    )


def jobs_by_id_range(
    conn: Conn, *, low: UUID, high: UUID, suffix: str | None, limit: int
) -> list[Row]:
    """Jobs with ``low <= id <= high`` (an id prefix) whose id ends in ``suffix`` when
    given, newest first, at most ``limit``."""
    return _rows(
        conn,
        "console_jobs_by_id_range",
        {"low": low, "high": high, "suffix": suffix, "limit": limit},
    )


def reasons(conn: Conn) -> list[str]:
    """The distinct dead-letter reasons (at most 200), sorted."""
    return [r["reason"] for r in _rows(conn, "console_reasons", {})]


# --- schedules and tenants ----------------------------------------------------------------


def schedules_page(
    conn: Conn,
    *,
    limit: int,
    runs: int,
    tenant_id: str | None = None,
    after: tuple[str, datetime, UUID] | None = None,
) -> list[Row]:
    """Schedules ordered by tenant, then newest first, after the cursor ``after``
    (``(tenant_id, created_at, id)`` of the previous page's last row), each with
    ``recent_runs``: its ``runs`` latest slots (JSON objects with ``scheduled_at``,
    ``outcome``, ``job_id``, ``detail``, ``job_status``), newest first."""
    return _rows(
        conn,
        "console_schedules_page",
        {
            "limit": limit,
            "runs": runs,
            "tenant_id": tenant_id,
            "after_tenant": after[0] if after else None,
            "after_created_at": after[1] if after else None,
            "after_id": after[2] if after else None,
        },
    )


def schedule(conn: Conn, *, schedule_id: UUID) -> Row | None:
    """One schedule of any tenant, or None."""
    return _row(conn, "console_schedule", {"schedule_id": schedule_id})


def tenants_page(
    conn: Conn, *, limit: int, default_quota: int, after: str | None, prefix: str | None
) -> list[Row]:
    """Tenants by id after ``after`` (optionally only ids starting with ``prefix``), each
    with its ``quota`` (its override or ``default_quota``), ``queued`` and ``running`` jobs,
    ``refused_last_hour`` (of which ``quota_refused_last_hour``) and ``schedules``."""
    return _rows(
        conn,
        "console_tenants_page",
        {"limit": limit, "default_quota": default_quota, "after": after, "prefix": prefix},
    )


# --- webhooks ---------------------------------------------------------------------------------


def webhooks_page(
    conn: Conn,
    *,
    limit: int,
    sample: int,
    tenant_id: str | None = None,
    after: tuple[str, datetime, UUID] | None = None,
) -> list[Row]:
    """Endpoints by tenant, then newest first, after the cursor ``after`` (``(tenant_id,
    created_at, id)``), each with ``attempts`` and ``delivered`` among its last ``sample``
    attempts of the last 24 hours, ``last_attempt_at`` and ``pending_messages``; never a
    secret."""
    return _rows(
        conn,
        "console_webhooks_page",
        {
            "limit": limit,
            "sample": sample,
            "tenant_id": tenant_id,
            "after_tenant": after[0] if after else None,
            "after_created_at": after[1] if after else None,
            "after_id": after[2] if after else None,
        },
    )


def webhook(conn: Conn, *, endpoint_id: UUID) -> Row | None:
    """One endpoint of any tenant with ``pending_messages`` (never its secret), or None."""
    return _row(conn, "console_webhook", {"endpoint_id": endpoint_id})


# --- sessions ---------------------------------------------------------------------------------


def session_insert(
    conn: Conn, *, token_hash: bytes, key_id: UUID, csrf_token: str, lifetime_seconds: float
) -> Row:
    """Store a new session (only the token's hash); returns it with ``expires_at``."""
    row = conn.execute(
        q("console_sessions", "console_session_insert"),
        {
            "token_hash": token_hash,
            "key_id": key_id,
            "csrf_token": csrf_token,
            "lifetime_seconds": lifetime_seconds,
        },
    ).fetchone()
    assert row is not None
    return row


def session_touch(
    conn: Conn, *, token_hash: bytes, idle_seconds: float, touch_seconds: float = 60.0
) -> Row | None:
    """The live session for ``token_hash`` with its key's ``tenant_id``, ``scopes``,
    ``prefix`` and ``label``; None when it ended, idled out or its key is revoked. Marks it
    seen now when its last mark is older than ``touch_seconds`` (so the idle timeout is
    exact to within ``touch_seconds``, and most requests write nothing)."""
    return conn.execute(
        q("console_sessions", "console_session_touch"),
        {"token_hash": token_hash, "idle_seconds": idle_seconds, "touch_seconds": touch_seconds},
    ).fetchone()


def session_delete(conn: Conn, *, token_hash: bytes) -> bool:
    """End a session; False when there was none."""
    row = conn.execute(
        q("console_sessions", "console_session_delete"), {"token_hash": token_hash}
    ).fetchone()
    return row is not None


def session_prune(conn: Conn, *, idle_seconds: float, limit: int) -> int:
    """Delete up to ``limit`` ended sessions; returns how many."""
    return len(
        conn.execute(
            q("console_sessions", "console_session_prune"),
            {"idle_seconds": idle_seconds, "limit": limit},
        ).fetchall()
    )
