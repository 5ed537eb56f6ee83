"""Fairness: one tenant's bulk backlog against another tenant's bulk exports: the
starvation fair dispatch exists to prevent (docs/limits.md).

Tenant ``fair-a`` submits ``fairness_flood`` bulk-ish exports at once (``fairness_notes``
real notes each: exports.bulk, a fraction of a second of rendering each); tenant
``fair-b`` submits one bulk-ish export every second for ``fairness_seconds``. B's pickup
(submitted → claimed, from ``export_job_events``) is measured twice: on an empty system, and
with A's backlog queued. The stack is the publisher and one bulk-worker process with the
fair-dispatch defaults (1 bulk job in flight per tenant); quotas and submit rates are lifted
as in the other scenarios. Target: B's p99 with A's backlog ≤ one bulk export's run time
(A's median claimed → succeeded) + 1 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from bench.common import Config, percentile
from bench.e2e import build_stack, ours_settings
from bench.env import TENANT, BenchEnv
from devtools.waiting import wait_for
from exportcore.db import make_pool
from exportcore.domain import ExportFormat, ExportRequest
from exportcore.settings import Settings
from exportcore.store import tenants as tenant_store
from exportcore.submit import submit_export

FLOODER, VICTIM = "fair-a", "fair-b"

# A copy of the bench tenant's first notes (by id) for each tenant.
COPY = """
INSERT INTO notes (tenant_id, source_path, title, content, pinned, updated_at)
SELECT %(tenant)s, 'fair/' || n.id, n.title, n.content, n.pinned, n.updated_at
FROM (SELECT * FROM notes WHERE tenant_id = %(src)s ORDER BY id LIMIT %(n)s) n
"""

PICKUPS = """
SELECT j.id,
       extract(epoch FROM min(e.at) FILTER (WHERE e.kind = 'claimed')
                          - min(e.at) FILTER (WHERE e.kind = 'submitted'))::float8 AS pickup,
       extract(epoch FROM min(e.at) FILTER (WHERE e.kind = 'succeeded')
                          - max(e.at) FILTER (WHERE e.kind = 'claimed'))::float8 AS run
FROM export_jobs j JOIN export_job_events e ON e.job_id = j.id
WHERE j.id = ANY(%s::uuid[])
GROUP BY j.id
"""

# The fair-dispatch defaults (the other scenarios lift them in OURS_ENV).
DEFAULTS = Settings.model_fields
FAIR_ENV = {
    "TENANT_BULK_IN_FLIGHT": str(DEFAULTS["tenant_bulk_in_flight"].default),
    "TENANT_FAST_IN_FLIGHT": str(DEFAULTS["tenant_fast_in_flight"].default),
    "BULK_WORKER_CONCURRENCY": "1",
}


def _prepare(db: str, notes: int) -> None:
    with psycopg.connect(db, autocommit=True) as conn, conn.transaction():
        for tid in (FLOODER, VICTIM):
            tenant_store.tenant_upsert(conn, tenant_id=tid, name=tid)  # type: ignore[arg-type]
            conn.execute(COPY, {"tenant": tid, "src": TENANT, "n": notes})


def _rows(db: str, ids: list[UUID]) -> dict[UUID, dict[str, Any]]:
    with psycopg.connect(db, autocommit=True) as conn:
        return {
            r[0]: {"pickup": r[1], "run": r[2]} for r in conn.execute(PICKUPS, (ids,)).fetchall()
        }


def _summary(pickups: list[float]) -> dict[str, Any]:
    return {
        "samples": len(pickups),
        "p50_s": percentile(pickups, 50),
        "p99_s": percentile(pickups, 99),
        "max_s": max(pickups, default=None),
    }


def run_fairness(
    env: BenchEnv, cfg: Config, run_root: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """Both phases on one fresh database and one stack; returns the pickups, the bulk run
    time and whether the target was met."""
    db = env.fresh_database("fairness")
    broker = env.broker_url(5)
    out: dict[str, Any] = {
        "flood": cfg.fairness_flood,
        "notes_per_export": cfg.fairness_notes,
        "victim_seconds": cfg.fairness_seconds,
        "settings": FAIR_ENV,
    }
    stack = build_stack(
        env, db, broker, run_root / "fairness", ("publisher", "bulk-worker"), FAIR_ENV
    )
    settings = ours_settings(db, broker).model_copy(
        update={k.lower(): int(v) for k, v in FAIR_ENV.items()}
    )
    try:
        _prepare(db, cfg.fairness_notes)
        stack.start()
        pool = make_pool(settings, "bench-fairness", min_size=1, max_size=2)
        request = ExportRequest.build(ExportFormat.JSON, None, True)

        def submit(tenant: str) -> UUID:
            job = submit_export(pool, settings, tenant_id=tenant, request=request).job
            job_id: UUID = job["id"]
            return job_id

        def victim_phase() -> list[UUID]:
            ids = []
            for _ in range(int(cfg.fairness_seconds)):
                t = time.monotonic()
                ids.append(submit(VICTIM))
                time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
            return ids

        def settled(ids: list[UUID]) -> bool:
            rows = _rows(db, ids)
            return len(rows) == len(ids) and all(r["pickup"] is not None for r in rows.values())

        warm = submit(VICTIM)  # the workers are up and consuming before anything is timed
        wait_for(lambda: settled([warm]), 120, "the warm-up export picked up", interval=0.2)
        empty = victim_phase()
        wait_for(lambda: settled(empty), 120, "tenant B picked up (empty system)", interval=0.5)
        out["empty"] = _summary([r["pickup"] for r in _rows(db, empty).values()])
        log(f"  fairness, empty system: B pickup {out['empty']}")

        t = time.monotonic()
        flood = [submit(FLOODER) for _ in range(cfg.fairness_flood)]
        out["flood_submit_seconds"] = round(time.monotonic() - t, 2)
        backlog = victim_phase()
        wait_for(
            lambda: settled(backlog), 300, "tenant B picked up (behind the backlog)", interval=0.5
        )
        out["backlog"] = _summary([r["pickup"] for r in _rows(db, backlog).values()])
        runs = [r["run"] for r in _rows(db, flood).values() if r["run"] is not None]
        out["bulk_run_seconds"] = {"samples": len(runs), "p50_s": percentile(runs, 50)}
        with psycopg.connect(db, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'queued') FROM export_jobs "
                "WHERE tenant_id = %s",
                (FLOODER,),
            ).fetchone()
        out["flood_still_queued_at_end"] = row[0] if row else None
        pool.close()
        run = out["bulk_run_seconds"]["p50_s"]
        p99 = out["backlog"]["p99_s"]
        out["target_s"] = None if run is None else run + 1.0
        out["target_met"] = None if run is None or p99 is None else p99 <= run + 1.0
        log(
            f"  fairness, A's backlog of {cfg.fairness_flood}: B pickup {out['backlog']}, "
            f"bulk run p50 {run} s, target met: {out['target_met']}"
        )
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        log(f"  fairness: ERROR {out['error']}")
    finally:
        stack.stop()
        env.discard(db)
    return out
