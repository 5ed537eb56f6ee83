"""Fair dispatch under failure (docs/architecture.md INV-16 fair-dispatch): the publisher
and the bulk worker are SIGKILLed while a tenant's in-flight cap holds its events back. The
caps are counted from durable rows, so nothing of the held state lives in a process: after
the kills and the restarts nothing is lost, every job succeeds once, and no tenant ever had
more jobs running than its cap (checked on the history timestamps). Signals go only to PIDs
this environment started."""

from __future__ import annotations

import contextlib
import os
import signal
from datetime import datetime
from typing import Any

from devtools.drills.checks import finish_budget
from devtools.drills.harness import pid_alive, wait_for
from devtools.drills.registry import DrillContext, drill

FLOOD = 5  # bulk exports of the flooding tenant
STALL = "sleep:1"  # every attempt lasts at least a second: the flood stays held back
ENDS = ("succeeded", "failed", "cancelled", "retried", "lease_expired")


def running_intervals(history: list[dict[str, Any]]) -> list[tuple[datetime, datetime | None]]:
    """(claimed, end) of every attempt in one job's history (oldest first); end is the
    first event after the claim that ends the attempt (None: still running)."""
    out: list[tuple[datetime, datetime | None]] = []
    start: datetime | None = None
    for e in history:
        if e["kind"] == "claimed":
            start = e["at"]
        elif start is not None and e["kind"] in ENDS:
            out.append((start, e["at"]))
            start = None
    if start is not None:
        out.append((start, None))
    return out


def max_overlap(intervals: list[tuple[datetime, datetime | None]]) -> int:
    """The most intervals that were open at once (an end at the same instant as a start
    closes first)."""
    points = []
    for start, end in intervals:
        points.append((start, 1))
        if end is not None:
            points.append((end, -1))
    best = now = 0
    for _, step in sorted(points, key=lambda p: (p[0], p[1])):
        now += step
        best = max(best, now)
    return best


def _kill(ctx: DrillContext, name: str) -> float:
    """SIGKILL a process's whole group (main process and children), as a container kill
    does, and start it again; returns when it was killed."""
    env, ev = ctx.env, ctx.ev
    proc = ctx.keep_running(name)
    pids = [proc.pid, *proc.children()]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed_at = ev.note(f"SIGKILL sent to {name}", pids=pids)
    wait_for(lambda: not any(pid_alive(p) for p in pids), 10, f"{name} to die")
    took = env.start_process(name)
    ev.note(f"{name} restarted (as its container would be)", seconds=round(took, 2))
    return killed_at


def _held(ctx: DrillContext, tenant: str) -> int:
    """Due outbox events of ``tenant`` on exports.bulk not claimed by any publisher."""
    return int(
        ctx.env.db.scalar(
            "SELECT count(*) FROM export_outbox WHERE tenant_id = %s AND queue = 'exports.bulk'"
            " AND sent_at IS NULL AND available_at <= now()"
            " AND (claimed_until IS NULL OR claimed_until < now())",
            (tenant,),
        )
    )


@drill(
    "fair_dispatch_kills",
    title="publisher and bulk worker SIGKILLed while a tenant's in-flight cap holds its "
    "events back",
    group="process",
    ci=True,
)
def fair_dispatch_kills(ctx: DrillContext) -> None:
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    cap = env.core_settings().tenant_bulk_in_flight
    ev.observe("bulk_cap", cap)
    env.arm("worker.before_finish", STALL, 4 * FLOOD)
    other = env.new_tenant("fair-other")
    flood = [ctx.submit(ctx.bulk(), role=f"flood-{i}") for i in range(FLOOD)]
    victim = other.api.submit_ok(ctx.bulk())
    ev.track(victim, "other tenant")
    jobs = [*flood, victim]
    tid = ctx.tenant.id

    # Held state: one of the flood runs, the rest wait in the outbox behind the cap.
    wait_for(
        lambda: (
            env.db.scalar(
                "SELECT count(*) FROM export_jobs WHERE tenant_id = %s AND status = 'running'",
                (tid,),
            )
            >= 1
            and _held(ctx, tid) >= 1
        ),
        30,
        "the flood running with events held back",
    )
    ev.observe("held_before_kills", _held(ctx, tid))
    killed = _kill(ctx, "publisher")
    ev.fault = {"signal": "SIGKILL", "of": "publisher, then bulk-worker (whole groups)"}
    wait_for(  # dispatched by the restarted publisher
        lambda: (
            env.db.scalar(
                "SELECT count(*) FROM export_jobs WHERE tenant_id = %s AND status = 'running'"
                " AND started_at > to_timestamp(%s)",
                (tid, killed),
            )
            >= 1
            and _held(ctx, tid) >= 1
        ),
        30,
        "a flood export dispatched by the new publisher, events still held back",
    )
    _kill(ctx, "bulk-worker")

    budget = finish_budget(s.lease_recovery_budget) + 10 * (FLOOD + 1)
    rows = {j: env.db.wait_terminal(j, budget) for j in jobs}
    histories = {j: env.db.history(j) for j in jobs}
    ev.observe(
        "kill_to_last_finish", max(r["finished_at"].timestamp() for r in rows.values()) - killed
    )
    ev.check(
        "every job succeeded",
        all(r["status"] == "succeeded" for r in rows.values()),
        {j: r["status"] for j, r in rows.items()},
    )
    ev.check(
        "each job succeeded exactly once (one succeeded event, one result)",
        all(sum(e["kind"] == "succeeded" for e in h) == 1 for h in histories.values()),
        {j: [e["kind"] for e in h] for j, h in histories.items()},
    )

    def unsent() -> int:
        return int(
            env.db.scalar(
                "SELECT count(*) FROM export_outbox WHERE job_id = ANY(%s::uuid[])"
                " AND sent_at IS NULL",
                (jobs,),
            )
        )

    # A re-dispatch the scanner made for a message that was only waiting in Redis (the bulk
    # worker was killed) may still be held behind the cap when the last job ends: the next
    # pass (PublisherConfig.held_recheck) sends it. Stuck means unsent after a few passes.
    with contextlib.suppress(AssertionError):
        wait_for(lambda: unsent() == 0, 5 + 4 * s.publisher_poll_seconds, "the outbox to drain")
    pending = unsent()
    ev.check_eq("nothing left unsent in the outbox (no event lost or stuck)", pending, 0)
    ev.observe(
        "lease_recoveries",
        sum(e["kind"] == "lease_expired" for h in histories.values() for e in h),
    )
    overlap = max_overlap([i for j in flood for i in running_intervals(histories[j])])
    ev.observe("flood_max_running_at_once", overlap)
    ev.check(
        f"the flooding tenant never had more than its cap ({cap}) running on exports.bulk",
        overlap <= cap,
        f"at most {overlap} at once",
    )
    b = {e["kind"]: e["at"] for e in reversed(histories[victim])}
    started_before = sum(
        1
        for j in flood
        if any(e["kind"] == "claimed" and e["at"] < b["claimed"] for e in histories[j])
    )
    ev.observe("flood_started_before_other_tenant", started_before)
    ev.check(
        "the other tenant's export did not wait for the whole flood",
        started_before < FLOOD,
        f"{started_before} of {FLOOD} flood exports started before it",
    )
