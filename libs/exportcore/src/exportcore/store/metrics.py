"""Scrape-time gauge queries (``sql/metrics.sql``)."""

from __future__ import annotations

from typing import Any

from exportcore.admission import admission_usage
from exportcore.db import Conn
from exportcore.settings import QUEUES, Settings
from exportcore.sql import q

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")


def metrics_snapshot(conn: Conn, settings: Settings, timeout_ms: int = 2000) -> dict[str, Any]:
    """Everything ``exportcore.metrics.DatabaseGauges`` exports, in one read-only transaction
    bounded by ``timeout_ms`` (raises ``psycopg.errors.QueryCanceled`` past it)."""
    conn.execute("SELECT set_config('statement_timeout', %s, true)", (str(int(timeout_ms)),))
    jobs = {(s, queue): 0 for s in STATUSES for queue in QUEUES}
    for r in conn.execute(q("metrics", "metrics_jobs_by_status")):
        jobs[(r["status"], r["queue"])] = int(r["n"])
    oldest = dict.fromkeys(QUEUES, 0.0)
    for r in conn.execute(q("metrics", "metrics_oldest_queued")):
        oldest[r["queue"]] = max(0.0, float(r["age"]))
    outbox = conn.execute(q("metrics", "metrics_outbox")).fetchone() or {}
    expired = conn.execute(q("metrics", "metrics_expired_leases")).fetchone() or {}
    dead = {r["reason"]: int(r["n"]) for r in conn.execute(q("metrics", "metrics_dead_letters"))}
    usage = admission_usage(conn, settings)
    return {
        "jobs": jobs,
        "oldest_queued": oldest,
        "outbox_unpublished": int(outbox.get("unpublished", 0)),
        "outbox_oldest_age": max(0.0, float(outbox.get("oldest_age", 0.0))),
        "expired_leases": int(expired.get("n", 0)),
        "dead_letters": dead,
        "admission_active": usage.active,
        "admission_capacity": usage.capacity,
        "tenants_at_quota": sum(1 for a, quota in usage.tenants.values() if a >= quota),
    }
