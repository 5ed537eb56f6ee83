"""``/console/``: the overview, and its live panel (``/console/overview/live``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from exportcore.admission import admission_usage
from exportcore.db import Conn
from exportcore.domain import QUEUES
from exportcore.settings import Settings
from exportcore.sql import q
from exportcore.store import console as console_store
from exportcore.store.dispatch_pauses import dispatch_pauses_list
from services.api.console.render import notice, page
from services.api.console.sessions import CurrentOperator
from services.api.deps import PoolDep, SettingsDep

router = APIRouter(prefix="/console", include_in_schema=False)

SPARK_MINUTES = 60
# The dashboards of grafana/dashboards/ (uid, title), linked when
# CONSOLE_GRAFANA_URL is set.
DASHBOARDS = (
    ("exports-backlog", "Backlog and throughput"),
    ("exports-recovery", "Recovery and SLOs"),
)


@dataclass(frozen=True)
class Spark:
    """The throughput sparkline: per minute (oldest first) succeeded and failed counts,
    drawn as an inline SVG of ``width`` x ``height`` with an accessible summary."""

    minutes: list[datetime]
    succeeded: list[int]
    failed: list[int]
    width: int = 600
    height: int = 64

    @property
    def peak(self) -> int:
        """The largest per-minute total (at least 1, to scale the bars)."""
        return max([s + f for s, f in zip(self.succeeded, self.failed, strict=True)] + [1])

    def bars(self) -> list[dict[str, Any]]:
        """One bar per minute: x, width, the heights of its succeeded and failed parts."""
        n = len(self.minutes)
        w = self.width / max(n, 1)
        peak = self.peak
        out = []
        for i, (m, s, f) in enumerate(zip(self.minutes, self.succeeded, self.failed, strict=True)):
            hs = self.height * s / peak
            hf = self.height * f / peak
            out.append(
                {
                    "x": round(i * w, 2),
                    "w": round(max(w - 1, 1), 2),
                    "ys": round(self.height - hs, 2),
                    "hs": round(hs, 2),
                    "yf": round(self.height - hs - hf, 2),
                    "hf": round(hf, 2),
                    "minute": m,
                    "succeeded": s,
                    "failed": f,
                }
            )
        return out

    @property
    def summary(self) -> str:
        """The chart in words (its accessible name)."""
        total_s, total_f = sum(self.succeeded), sum(self.failed)
        return (
            f"Finished exports per minute over the last {len(self.minutes)} minutes: "
            f"{total_s} succeeded, {total_f} failed; at most {self.peak} in one minute."
        )


def overview(conn: Conn, settings: Settings, now: datetime) -> dict[str, Any]:
    """Everything the overview shows, read in one short transaction."""
    queues: dict[str, dict[str, Any]] = {
        name: {
            "queued": 0,
            "waiting_retry": 0,
            "running": 0,
            "expired_leases": 0,
            "failed_hour": 0,
            "oldest": 0.0,
        }
        for name in QUEUES
    }
    for r in console_store.queue_counts(conn):
        queues[r["queue"]].update(
            queued=r["queued"],
            waiting_retry=r["waiting_retry"],
            running=r["running"],
            expired_leases=r["expired_leases"],
        )
    for r in conn.execute(q("metrics", "metrics_oldest_queued")):
        queues[r["queue"]]["oldest"] = max(0.0, float(r["age"]))
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=SPARK_MINUTES - 1)
    minutes = [start + timedelta(minutes=i) for i in range(SPARK_MINUTES)]
    succeeded = dict.fromkeys(minutes, 0)
    failed = dict.fromkeys(minutes, 0)
    hour_ago = now - timedelta(hours=1)
    for r in console_store.finished_by_minute(conn, minutes=SPARK_MINUTES + 1):
        m = r["minute"].astimezone(UTC)
        if m in succeeded:
            succeeded[m] += r["succeeded"]
            failed[m] += r["failed"]
        if m >= hour_ago.replace(second=0, microsecond=0):
            queues[r["queue"]]["failed_hour"] += r["failed"]
    paused = dispatch_pauses_list(conn)
    for queue_name, r in queues.items():
        r["paused"] = any(p["queue"] == queue_name and p["tenant_id"] is None for p in paused)
        r["tenants_paused"] = sum(
            1 for p in paused if p["queue"] == queue_name and p["tenant_id"] is not None
        )
    outbox = conn.execute(q("metrics", "metrics_outbox")).fetchone() or {}
    usage = admission_usage(conn, settings)
    at_quota = sorted(t for t, (active, quota) in usage.tenants.items() if active >= quota)
    return {
        "queues": queues,
        "pauses": paused,
        "outbox_unpublished": int(outbox.get("unpublished", 0)),
        "outbox_oldest": max(0.0, float(outbox.get("oldest_age", 0.0))),
        "active": usage.active,
        "capacity": usage.capacity,
        "at_quota": at_quota,
        "open_dead_letters": console_store.open_dead_letters(conn),
        "spark": Spark(
            minutes=minutes,
            succeeded=[succeeded[m] for m in minutes],
            failed=[failed[m] for m in minutes],
        ),
        "dashboards": [
            (f"{settings.console_grafana_url}/d/{uid}", title) for uid, title in DASHBOARDS
        ]
        if settings.console_grafana_url
        else [],
    }


def _data(pool: PoolDep, settings: SettingsDep) -> dict[str, Any]:
    now = datetime.now(UTC)
    with pool.connection() as conn, conn.transaction():
        conn.execute("SET TRANSACTION READ ONLY")
        return {"now": now, **overview(conn, settings, now)}


@router.get("")
def console_root() -> Response:
    """``/console`` → ``/console/``."""
    return RedirectResponse("/console/", status_code=308)


@router.get("/")
def overview_page(
    request: Request, operator: CurrentOperator, pool: PoolDep, settings: SettingsDep
) -> Response:
    """The overview: queues, outbox, admission, dead letters, throughput (live); the
    dispatch pauses in force and the control that pauses and resumes dispatch."""
    return page(
        request,
        "overview.html",
        _data(pool, settings) | {"nav": "overview", "notice": notice(request)},
    )


@router.get("/overview/live")
def overview_live(
    request: Request, operator: CurrentOperator, pool: PoolDep, settings: SettingsDep
) -> Response:
    """The overview's live panel alone (polled by htmx every CONSOLE_REFRESH_SECONDS)."""
    return page(request, "_overview_live.html", _data(pool, settings))
