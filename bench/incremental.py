"""Bulk, incremental: a nightly delta of 1 % changed notes against the full export of the same
account (``bulk_delta_notes`` notes, 200,000 by default; ndjson).

The account is filled like the bulk scenario (real notes repeated), a full export runs
through the real bulk-worker, then 1 % of the notes change (every 100th by id) and a delta
since the full export runs the same way. Each export's time is its submit (validation,
selection and snapshot copy in one transaction) plus its render (claimed → succeeded, from
``export_job_events``); the figure is delta time / full time (target: at most 0.05).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from bench.bulk import BULK_TENANT, _events, fill_notes
from bench.common import Config
from bench.e2e import build_stack, ours_settings
from bench.env import BenchEnv
from devtools.waiting import became_true
from exportcore.db import make_pool
from exportcore.domain import ExportFormat, ExportRequest
from exportcore.submit import submit_export

CHANGED_EVERY = 100
"""1 % of the notes change between the full export and the delta."""
MAX_SELECTION = 1_000_000


def run_delta(
    env: BenchEnv, cfg: Config, run_root: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """The full export, 1 % of the notes changed, the delta; both timed."""
    db = env.fresh_database("delta")
    out: dict[str, Any] = {}
    broker = env.broker_url(5)
    stack = build_stack(
        env,
        db,
        broker,
        run_root / "bulk-delta",
        ("publisher", "bulk-worker"),
        {"BULK_WORKER_CONCURRENCY": "1", "MAX_SELECTION": str(MAX_SELECTION)},
    )
    settings = ours_settings(db, broker, max_selection=MAX_SELECTION, db_statement_timeout_ms=0)
    try:
        out["notes"] = fill_notes(db, cfg.bulk_delta_notes, cfg.bulk_note_max_bytes)
        stack.start()
        pool = make_pool(settings, "bench-delta", min_size=1, max_size=1)
        try:
            full = _export(pool, settings, db, None)
            with psycopg.connect(db, autocommit=True) as conn:
                changed = conn.execute(
                    "UPDATE notes SET content = content || ' (edited)', updated_at = now()"
                    " WHERE tenant_id = %s AND id %% %s = 0",
                    (BULK_TENANT, CHANGED_EVERY),
                ).rowcount
            delta = _export(pool, settings, db, full["job_id"])
        finally:
            pool.close()
        out.update(full=full, delta=delta, changed=changed)
        out["ratio"] = delta["seconds"] / full["seconds"]
        log(
            f"  bulk delta: {changed} changed of {full['notes']}: delta {delta['seconds']:.2f} s"
            f" / full {full['seconds']:.2f} s = {out['ratio']:.4f}"
        )
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        log(f"  bulk delta: ERROR {out['error']}")
    finally:
        stack.stop()
        env.discard(db)
    return out


def _export(pool: Any, settings: Any, db: str, since: UUID | None) -> dict[str, Any]:
    request = ExportRequest.build(ExportFormat.NDJSON, None, True, since)
    t = time.monotonic()
    job = submit_export(pool, settings, tenant_id=BULK_TENANT, request=request).job
    submit = time.monotonic() - t
    became_true(
        lambda: _events(db, job["id"])["status"] in ("succeeded", "failed", "cancelled"),
        timeout=1800,
        interval=0.2,
    )
    ev = _events(db, job["id"])
    if ev["status"] != "succeeded":
        raise RuntimeError(f"export {job['id']} {ev['status']} ({ev['error_code']})")
    render = float(ev["render_seconds"])
    return {
        "job_id": job["id"],
        "notes": job["note_count"],
        "bytes": ev["bytes"],
        "submit_seconds": round(submit, 3),
        "render_seconds": round(render, 3),
        "seconds": submit + render,
    }
