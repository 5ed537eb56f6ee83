"""Process faults a Kubernetes deployment sees: a container child OOM-killed, a container
killed, a node stalling a process past its lease, a rolling restart of the api under load,
the recovery-scanner gone for a while. Signals go only to PIDs this environment started."""

from __future__ import annotations

import os
import signal
import time
from typing import Any
from uuid import UUID

from devtools.drills.checks import (
    claim_events,
    kinds,
    lease_recovery,
    refusal_summary,
    stopped_unpublished,
)
from devtools.drills.evidence import log_time, seconds_between
from devtools.drills.harness import pid_alive, process_state, wait_exit, wait_for
from devtools.drills.load import (
    LoadGenerator,
    check_answers,
)
from devtools.drills.registry import DrillContext, drill
from exportcore.artifacts import artifact_key
from exportcore.domain import ExportFormat


def _stall_in_render(ctx: DrillContext, seconds: float = 60.0) -> tuple[str, dict[str, Any]]:
    """Submit a small export whose child stalls inside a render chunk (its lease renewal
    thread keeps the lease); returns (job id, the failpoint hit with the child's pid)."""
    ctx.env.arm("render.chunk", f"sleep:{seconds}", 1)
    job = ctx.submit(ctx.small(3))
    hit = ctx.env.wait_hits("render.chunk", 1, 30)[0]
    ctx.env.db.wait_status(job, "running", 10)
    return job, hit


@drill(
    "sigkill_worker_child",
    title="SIGKILL of the Celery prefork child in the middle of an export",
    group="process",
    ci=True,
    s3=True,
)
def sigkill_worker_child(ctx: DrillContext) -> None:
    env, ev = ctx.env, ctx.ev
    worker = env.proc("fast-worker")
    main_pid = worker.pid
    job, hit = _stall_in_render(ctx)
    child = hit["pid"]
    env.signal_child("fast-worker", child, signal.SIGKILL)
    killed_at = ev.note("SIGKILL sent to the child", pid=child, main_pid=main_pid)
    ev.fault = {"signal": "SIGKILL", "pid": child, "of": "fast-worker prefork child"}
    wait_for(lambda: not pid_alive(child), 10, f"child {child} to die")
    row = lease_recovery(ctx, job, killed_at, "after SIGKILL of the child")
    stored = env.artifacts_of(row["tenant_id"], job)
    ev.check(
        "the store holds one complete object of the job: its result (none of the dead attempt)",
        [e["key"] for e in stored if e["complete"]] == [row["result_ref"]],
        stored,
    )
    concurrency = ctx.settings.fast_worker_concurrency
    try:
        wait_for(
            lambda: (
                child not in (kids := worker.children())
                and len(kids) == concurrency
                and all(pid_alive(p) for p in kids)
            ),
            30,
            "the worker to reap and replace its child",
        )
        replaced_at: float | None = time.time()
    except AssertionError:
        replaced_at = None
    now = {p: process_state(p) for p in worker.children()}
    ev.recovery_seconds["child_replaced_after"] = seconds_between(killed_at, replaced_at)
    ev.check(
        "the worker's main process survived and replaced the child",
        worker.alive and worker.pid == main_pid and replaced_at is not None,
        f"main {worker.pid} alive {worker.alive}, children {now}",
    )


@drill(
    "sigkill_worker_main",
    title="SIGKILL of the Celery worker's main process in the middle of an export",
    group="process",
    ci=True,
)
def sigkill_worker_main(ctx: DrillContext) -> None:
    env, ev = ctx.env, ctx.ev
    worker = ctx.keep_running("fast-worker")
    job, _ = _stall_in_render(ctx)
    main_pid, children = worker.pid, worker.children()
    os.kill(main_pid, signal.SIGKILL)
    killed_at = ev.note("SIGKILL sent to the main process", pid=main_pid, children=children)
    ev.fault = {"signal": "SIGKILL", "pid": main_pid, "of": "fast-worker main process"}
    code = wait_exit(worker, 10, "the main process to die")
    try:
        wait_for(lambda: not any(pid_alive(p) for p in children), 10, "the children to exit")
        orphans: list[int] = []
    except AssertionError:
        orphans = [p for p in children if pid_alive(p)]
        for p in orphans:  # what the container runtime would do; the check below fails
            os.kill(p, signal.SIGKILL)
    ev.observe("main_exit_code", code)
    ev.observe("children_exit_seconds", round(time.time() - killed_at, 3))
    ev.check(
        "its prefork children died with it (none keeps renewing the lease as an orphan)",
        not orphans,
        f"children {children}, orphans {orphans}",
    )
    took = env.start_process("fast-worker")
    ev.note("fast-worker restarted (as its container would be)", seconds=round(took, 2))
    ev.recovery_seconds["worker_restart_seconds"] = round(took, 3)
    lease_recovery(ctx, job, killed_at, "after SIGKILL of the worker")


@drill(
    "sigstop_worker_past_lease",
    title="a worker stalls (SIGSTOP) longer than its lease, then resumes (SIGCONT)",
    group="process",
    ci=True,
)
def sigstop_worker_past_lease(ctx: DrillContext) -> None:
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    worker = env.proc("fast-worker")
    # Position the child between its last lease check and its finish, for less time than
    # the lease it still holds (>= 2/3 of it): without the stop it would finish normally.
    position = round(s.lease_seconds / 2, 2)
    env.arm("worker.before_finish", f"sleep:{position}", 1)
    job = ctx.submit(ctx.small(3))
    hit = env.wait_hits("worker.before_finish", 1, 30)[0]
    token1 = str(env.db.job(job)["lease_token"])
    group = [worker.pid, *worker.children()]
    worker.signal(signal.SIGSTOP, group=True)
    stopped_at = ev.note("SIGSTOP sent to the fast-worker's process group", pids=group)
    ctx.defer("fast-worker resumed", lambda: worker.signal(signal.SIGCONT, group=True))
    ev.fault = {"signal": "SIGSTOP then SIGCONT", "pids": group, "lease_token": token1}
    ev.check(
        "stopped while the child was still inside its short stall, before its finish",
        stopped_at - hit["at"] < position,
        f"stopped {stopped_at - hit['at']:.3f} s into a {position} s stall",
    )
    try:  # signal delivery is asynchronous: a running process stops a moment later
        states = wait_for(
            lambda: (
                (st := {p: process_state(p) for p in group}) and set(st.values()) == {"T"} and st
            ),
            5,
            "every process of the worker to be stopped",
            interval=0.01,
        )
    except AssertionError:
        states = {p: process_state(p) for p in group}
    ev.check("every process of the worker is stopped", set(states.values()) == {"T"}, states)
    expired = env.db.wait_event(job, "lease_expired", s.lease_recovery_budget + 30)[0]
    during = env.db.job(job)
    ev.check_eq(
        "the scanner requeued the job while the worker was stopped", during["status"], "queued"
    )
    worker.signal(signal.SIGCONT, group=True)
    resumed_at = ev.note("SIGCONT sent")
    ev.observe("stopped_seconds", round(resumed_at - stopped_at, 3))
    # The lease was last renewed before the stop, so it can expire a little under
    # lease_seconds after it: what matters is that the worker resumed past the expiry.
    ev.check(
        "the worker stayed stopped until its lease had expired",
        expired["at"].timestamp() < resumed_at,
        f"stopped {resumed_at - stopped_at:.2f} s (lease {s.lease_seconds} s); lease expired"
        f" {expired['at'].timestamp() - stopped_at:.2f} s after the stop",
    )

    late = wait_for(
        lambda: stopped_unpublished(ctx, job, token1),
        30,
        "the resumed child's finish to be refused",
    )[0]
    row = env.db.wait_terminal(job, 60)
    history = env.db.history(job)
    claims = claim_events(history)
    done = [e for e in history if e["kind"] == "succeeded"]
    ev.observe("refused_finish_log", late)
    ev.check_eq("the resumed child's finish was refused", late.get("why"), "finish refused")
    ev.check(
        "the job completed once, through recovery, under a new token",
        row["status"] == "succeeded"
        and len(done) == 1
        and str(done[0]["lease_token"]) != token1
        and len(claims) == 2,
        f"history {kinds(history)}",
    )
    old_key = artifact_key(
        row["tenant_id"], row["id"], UUID(token1), ExportFormat(row["format"]).extension
    )
    stored = [o["key"] for o in env.artifacts_of(row["tenant_id"], job)]
    ev.check(
        "the stale artifact is gone; only the published one remains",
        stored == [row["result_ref"]] and old_key not in stored,
        stored,
    )
    rec = ev.recovery_seconds
    rec["stop_to_lease_expired"] = seconds_between(stopped_at, expired["at"])
    rec["stop_to_claimed_again"] = seconds_between(stopped_at, claims[-1]["at"])
    rec["stop_to_succeeded"] = seconds_between(stopped_at, row["finished_at"])
    rec["refused_finish_after_resume"] = round((log_time(late) or resumed_at) - resumed_at, 3)
    ev.check_le(
        "requeued within lease + scan interval of the stop",
        rec["stop_to_lease_expired"],
        s.lease_seconds + s.scan_budget,
    )
    ev.duplicate_deliveries = {"claim_refusals": refusal_summary(ctx, job)}


@drill(
    "api_sigterm_under_load",
    title="SIGTERM to the api (gunicorn) while clients submit",
    group="process",
    ci=True,
)
def api_sigterm_under_load(ctx: DrillContext) -> None:
    env, ev = ctx.env, ctx.ev
    api = ctx.keep_running("api")
    load = LoadGenerator(env, ctx.tenant, rate=10, threads=4, bulk_share=0.0, seed=7).start()
    try:
        wait_for(lambda: len(load.accepted) >= 15, 60, "15 accepted submits before the signal")
        # Hold a few submits inside their transaction for a moment, so that the signal
        # surely finds requests in flight (positioning, not the fault).
        env.arm("submit.before_commit", "sleep:1.5", 3)
        env.wait_hits("submit.before_commit", 1, 30)
        pid = api.pid
        api.signal(signal.SIGTERM)
        term_at = ev.note("SIGTERM sent to the gunicorn master", pid=pid)
        ev.fault = {"signal": "SIGTERM", "pid": pid, "of": "api (gunicorn master)"}
        code = wait_exit(api, 60, "the api to drain and exit")
        exit_at = ev.note("api exited", exit_code=code)
        ev.check_eq("the api drained and exited 0", code, 0)
        wait_for(
            lambda: any(a.sent_at > exit_at and a.status != 202 for a in load.attempts),
            30,
            "a submit to fail while the api is away",
        )
        took = env.start_process("api")
        up_at = ev.note("api restarted", seconds=round(took, 2))
        wait_for(
            lambda: sum(a.sent_at > up_at for a in load.accepted) >= 10,
            60,
            "10 accepted submits after the restart",
        )
    finally:
        load.stop()
    in_flight = [a for a in load.attempts if a.sent_at <= term_at <= a.done_at]
    ev.observe("in_flight_at_term", [a.status or a.error for a in in_flight])
    ev.observe("attempts", len(load.attempts))
    check_answers(ev, env, ctx.tenant, load.attempts, set())
    ev.check(
        "requests in flight when TERM arrived were still answered 202 (drained)",
        bool(in_flight) and all(a.status == 202 for a in in_flight),
        [a.status or a.error for a in in_flight],
    )
    for a in load.accepted:
        ev.track(a.job_id, "accepted under load")
    for a in load.accepted:
        assert a.job_id is not None
        env.db.wait_terminal(a.job_id, 120)
    states = env.db.sql(
        "SELECT status, count(*) AS n FROM export_jobs WHERE tenant_id = %s GROUP BY status",
        (ctx.tenant.id,),
    )
    ev.check_eq(
        "every accepted export succeeded",
        {r["status"]: r["n"] for r in states},
        {"succeeded": len(load.accepted)},
    )
    ev.recovery_seconds["api_down_seconds"] = seconds_between(exit_at, up_at)


@drill(
    "scanner_down_catch_up",
    title="the recovery-scanner is stopped while recoveries pile up, then restarted",
    group="process",
    ci=True,
)
def scanner_down_catch_up(ctx: DrillContext) -> None:
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    code = ctx.stop("recovery-scanner")
    stopped_at = ev.note("recovery-scanner stopped (TERM)", exit_code=code)
    ev.check_eq("the scanner stopped cleanly", code, 0)
    ev.fault = {"kind": "recovery-scanner down", "work piled up": "3 lost dispatches, 1 dead lease"}
    # Work that only the scanner can do: three deliveries fail before claiming (lost
    # messages) and one export's child dies holding its lease.
    env.arm("worker.before_claim", "db", 3)
    env.arm("render.chunk", "exit", 1)
    jobs = [ctx.submit(ctx.small(2), role="needs the scanner") for _ in range(4)]
    env.wait_hits("worker.before_claim", 3, 30)
    last = env.wait_hits("render.chunk", 1, 30)[-1]["at"]
    quiet = max(s.dispatch_threshold_seconds, s.lease_seconds) + 3 * s.scan_budget
    wait_for(lambda: time.time() > last + quiet, quiet + 10, "recoveries to be overdue")
    rows = {j: env.db.job(j) for j in jobs}
    recovered = [j for j in jobs if {"redispatched", "lease_expired"} & set(env.db.kinds(j))]
    expired = [
        r["id"]
        for r in env.db.sql(
            "SELECT id FROM export_jobs WHERE id = ANY(%s::uuid[]) AND status = 'running'"
            " AND lease_expires_at < now()",
            (jobs,),
        )
    ]
    ev.observe("overdue_for_seconds", round(time.time() - last, 2))
    ev.check_eq("nothing recovered while the scanner was down", recovered, [])
    ev.check(
        "three jobs wait queued with a lost message, one runs on an expired lease",
        sorted(r["status"] for r in rows.values()) == ["queued", "queued", "queued", "running"]
        and len(expired) == 1,
        {j: r["status"] for j, r in rows.items()},
    )
    env.start_process("recovery-scanner")
    started_at = ev.note("recovery-scanner started")
    for j in jobs:
        env.db.wait_terminal(j, 60)
    firsts = []
    for j in jobs:
        history = env.db.history(j)
        rec = [e["at"] for e in history if e["kind"] in ("redispatched", "lease_expired")]
        if rec:
            firsts.append(rec[0].timestamp())
    statuses = [env.db.job(j)["status"] for j in jobs]
    ev.check_eq("every job was recovered and succeeded", statuses, ["succeeded"] * 4)
    ev.check_eq("each was recovered by the restarted scanner", len(firsts), 4)
    if firsts:
        ev.recovery_seconds["start_to_first_recovery"] = round(min(firsts) - started_at, 3)
        ev.recovery_seconds["start_to_last_recovery"] = round(max(firsts) - started_at, 3)
        ev.recovery_seconds["down_seconds"] = round(started_at - stopped_at, 3)
        ev.check(
            "it caught up at once: every recovery after the restart, within one pass",
            min(firsts) >= started_at and max(firsts) - min(firsts) <= s.scan_budget,
            f"recoveries {[round(f - started_at, 3) for f in sorted(firsts)]} s after start",
        )
