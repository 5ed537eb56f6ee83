"""Scrape-time gauge queries (``sql/metrics.sql``)."""

from __future__ import annotations

from typing import Any

from exportcore.admission import admission_usage
from exportcore.db import Conn
from exportcore.domain import QUEUES
from exportcore.settings import Settings
from exportcore.sql import q
from exportcore.store.dispatch_pauses import dispatch_pauses_list

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
    backlog = tenant_backlog(
        list(
            conn.execute(
                q("metrics", "metrics_tenant_backlog"),
                {
                    "bulk_cap": settings.tenant_bulk_in_flight,
                    "fast_cap": settings.tenant_fast_in_flight,
                    "sent_ids": [],
                },
            )
        ),
        top_n=settings.metrics_tenant_top_n,
        named=settings.metric_tenants,
    )
    schedules = {"enabled": 0, "backing_off": 0}
    paused: dict[str, int] = {}
    for r in conn.execute(q("metrics", "metrics_schedules")):
        if r["enabled"]:
            schedules["enabled"] += int(r["n"])
            schedules["backing_off"] += int(r["backing_off"])
        else:
            reason = r["reason"] or "requested"
            paused[reason] = paused.get(reason, 0) + int(r["n"])
    return {
        "dispatch_pauses": dispatch_pauses_list(conn),
        "pause_alert_seconds": settings.dispatch_pause_alert_seconds,
        "jobs": jobs,
        "oldest_queued": oldest,
        "outbox_unpublished": int(outbox.get("unpublished", 0)),
        "outbox_oldest_age": max(0.0, float(outbox.get("oldest_age", 0.0))),
        "expired_leases": int(expired.get("n", 0)),
        "dead_letters": dead,
        "admission_active": usage.active,
        "admission_capacity": usage.capacity,
        "tenants_at_quota": sum(1 for a, quota in usage.tenants.values() if a >= quota),
        "tenant_backlog": backlog,
        "held_back": {
            queue: sum(v["held_back"] for (_, qu), v in backlog.items() if qu == queue)
            for queue in QUEUES
        },
        "schedules": schedules,
        "schedules_paused": paused,
    }


OTHER = "other"


def tenant_backlog(
    rows: list[dict[str, Any]], *, top_n: int, named: frozenset[str]
) -> dict[tuple[str, str], dict[str, float]]:
    """Per-tenant backlog with bounded labels: ``{(tenant label, queue): {queued, running,
    oldest_age, held_back}}`` (``held_back``: due events its in-flight cap holds back).

    ``rows`` are ``metrics_tenant_backlog`` rows. The tenants named in ``named`` (every one
    with ``*``) and the ``top_n`` furthest behind (oldest due queued job first, then most
    active jobs) keep their id as label, with every queue present (zeros included, so that
    "running == 0" can be matched); all others are summed into ``other`` (oldest age: the
    maximum). At most ``top_n + len(named) + 1`` labels, whatever the number of tenants.
    """
    per_tenant: dict[str, dict[str, dict[str, float]]] = {}
    for r in rows:
        per_tenant.setdefault(r["tenant_id"], {})[r["queue"]] = {
            "queued": float(r["queued"]),
            "running": float(r["running"]),
            "oldest_age": max(0.0, float(r["oldest_age"])),
            "held_back": float(r.get("held_back") or 0),
        }

    def behind(tenant: str) -> tuple[float, float]:
        queues = per_tenant[tenant].values()
        return (
            max(q["oldest_age"] for q in queues),
            sum(q["queued"] + q["running"] for q in queues),
        )

    chosen = set(per_tenant) if "*" in named else {t for t in named if t != "*"}
    ranked = sorted((t for t in per_tenant if t not in chosen), key=behind, reverse=True)
    chosen.update(ranked[:top_n])
    empty = {"queued": 0.0, "running": 0.0, "oldest_age": 0.0, "held_back": 0.0}
    out: dict[tuple[str, str], dict[str, float]] = {}
    for label in [*sorted(chosen), OTHER]:
        for queue in QUEUES:
            out[(label, queue)] = dict(empty)
    for tenant, queues in per_tenant.items():
        label = tenant if tenant in chosen else OTHER
        for queue, values in queues.items():
            into = out.setdefault((label, queue), dict(empty))
            into["queued"] += values["queued"]
            into["running"] += values["running"]
            into["held_back"] += values["held_back"]
            into["oldest_age"] = max(into["oldest_age"], values["oldest_age"])
    return out
