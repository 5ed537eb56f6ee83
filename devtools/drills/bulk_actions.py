"""A bulk action outlives the processes around it (lesson 03: work that
changes users' assets does not live in the request process). The api only writes a bulk
action; the recovery-scanner's bulk runner runs it under a lease. Signals go only to PIDs
this environment started."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import uuid4

import httpx

from devtools.drills.harness import wait_exit, wait_for
from devtools.drills.registry import DrillContext, drill
from exportcore.db import make_pool
from exportcore.domain import ExportFormat, ExportRequest
from exportcore.submit import submit_export

TARGETS = 800
"""Queued exports the bulk cancel acts on (under the default tenant quota of 1,000)."""
BATCH_PAUSE = 0.4
"""Seconds each batch waits at the ``bulk.batch`` failpoint: 8 batches, a run of ~4 s, so
the kills land mid-run (positioning, not the fault)."""


@drill(
    "bulk_action_survives_sigkill",
    title="SIGKILL to the api, then to the recovery-scanner, mid-run of a big bulk cancel",
    group="process",
    ci=True,
)
def bulk_action_survives_sigkill(ctx: DrillContext) -> None:
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    # the exports stay queued (the targets of a bulk cancel) while the publisher is away
    ev.check_eq("the publisher stopped cleanly", ctx.stop("publisher"), 0)
    ev.note("writing the queued exports")
    core = env.core_settings()
    request = ExportRequest.build(ExportFormat.JSON, ctx.tenant.note_ids[:1], False)
    pool = make_pool(core, "drills-bulk", min_size=1, max_size=4)
    try:
        with ThreadPoolExecutor(4) as workers:
            jobs = list(
                workers.map(
                    lambda _: str(
                        submit_export(pool, core, tenant_id=ctx.tenant.id, request=request).job[
                            "id"
                        ]
                    ),
                    range(TARGETS),
                )
            )
    finally:
        pool.close()
    ev.note("queued exports written", n=len(jobs))
    env.arm("bulk.batch", f"sleep:{BATCH_PAUSE}", 1000)
    api = ctx.keep_running("api")
    scanner = ctx.keep_running("recovery-scanner")
    admin = {**ctx.tenant.api.admin, "Content-Type": "application/json"}
    with httpx.Client(base_url=env.api_url, headers=admin, timeout=20) as http:
        filt = {"tenant": ctx.tenant.id}
        seen = http.post(
            "/v1/admin/bulk-actions/preview", json={"action": "cancel", "filter": filt}
        ).json()
        ev.check_eq("the preview counts every queued export", seen["count"], TARGETS)
        r = http.post(
            "/v1/admin/bulk-actions",
            json={
                "action": "cancel",
                "filter": filt,
                "as_of": seen["as_of"],
                "confirmed_count": seen["count"],
                "request_id": str(uuid4()),
            },
        )
    answered = ev.note("bulk cancel accepted", status=r.status_code)
    ev.check_eq("the start answered 202", r.status_code, 202)
    bulk_id = r.json()["id"]

    def run() -> dict[str, Any]:
        [row] = env.db.sql("SELECT * FROM bulk_actions WHERE id = %s", (bulk_id,))
        return dict(row)

    wait_for(lambda: run()["batches"] >= 1, 30, "the first batch")
    ev.recovery_seconds["start_to_first_batch"] = round(time.time() - answered, 3)
    # 1. the api dies (every process of it) mid-run
    api_pid = api.pid
    api.signal(signal.SIGKILL, group=True)
    wait_exit(api, 15, "the api to die")
    killed = run()
    ev.note("api SIGKILLed", pid=api_pid, seen=killed["seen"])
    ev.fault = {"signal": "SIGKILL", "of": ["api (gunicorn, whole group)", "recovery-scanner"]}
    ev.check("the api died mid-run", killed["state"] == "running", killed)
    wait_for(lambda: run()["seen"] > killed["seen"], 30, "the run to go on without the api")
    ev.check("the run went on while the api was down", True, run()["seen"])
    # 2. the runner itself dies mid-run: another scanner takes the run on after its lease
    before = run()
    scanner.signal(signal.SIGKILL, group=True)
    wait_exit(scanner, 15, "the recovery-scanner to die")
    died_at = ev.note("recovery-scanner SIGKILLed", seen=before["seen"])
    held_by = run()["lease_token"]
    env.start_process("recovery-scanner")
    ev.note("recovery-scanner started again")
    wait_for(
        lambda: run()["lease_token"] not in (None, held_by) or run()["state"] != "running",
        s.bulk_lease_seconds + s.scan_budget + 30,
        "a new runner to take the run on",
    )
    ev.recovery_seconds["runner_death_to_takeover"] = round(time.time() - died_at, 3)
    wait_for(lambda: run()["state"] != "running", 120, "the run to end")
    ended = run()
    ev.observe("bulk_action", {k: ended[k] for k in ("state", "seen", "acted", "skipped")})
    ev.check_eq(
        "the run ended by itself, every target reached and acted on",
        (ended["state"], ended["seen"], ended["acted"], ended["skipped"]),
        ("done", TARGETS, TARGETS, 0),
    )
    counts = env.db.sql(
        "SELECT n, count(*) AS jobs FROM (SELECT j.id, count(e.id) AS n FROM export_jobs j"
        " LEFT JOIN export_job_events e ON e.job_id = j.id AND e.kind = 'cancel_requested'"
        " WHERE j.id = ANY(%s::uuid[]) GROUP BY j.id) per GROUP BY n",
        (jobs,),
    )
    ev.check_eq(
        "every target was acted on exactly once (one cancel request each)",
        {r["n"]: r["jobs"] for r in counts},
        {1: TARGETS},
    )
    [entry] = env.db.sql(
        "SELECT count, outcome FROM operator_actions WHERE id = %s", (ended["audit_id"],)
    )
    ev.check_eq(
        "its one audit row counts them", (entry["count"], entry["outcome"]), (TARGETS, "done")
    )
    env.disarm()
    env.start_process("api")
    ev.note("api started again")
    ev.check(
        "no operator resumed it (no resume request in the api's log)",
        "/resume" not in api.log_text(),
        "",
    )
