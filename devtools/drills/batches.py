"""Faults inside a batch: several small exports claimed together by one worker child (its
message's job and the due ones its claim took from the outbox, ``WORKER_CLAIM_JOBS``) and
finished together. A batch is formed the way production forms one, by a backlog: the
publisher is paused (SIGSTOP) while the jobs are submitted, and resumed; its next pass sends
``PUBLISHER_MESSAGES_AHEAD`` one-job messages and leaves the rest in the outbox, and the
claim of each message takes its share. Signals go only to PIDs this environment
started."""

from __future__ import annotations

import signal
from collections import defaultdict
from typing import Any

from devtools.drills.checks import (
    claim_events,
    finish_budget,
    kinds,
    lease_recovery,
    stopped_unpublished,
)
from devtools.drills.harness import pid_alive, wait_exit, wait_for
from devtools.drills.registry import DrillContext, drill
from exportcore.domain import TERMINAL_STATES as TERMINAL

# two messages ahead (PUBLISHER_MESSAGES_AHEAD = 2), each claim takes three
# (WORKER_CLAIM_JOBS = 3 in the drill settings): two batches of three, one per worker child
BATCH_JOBS = 6


def _submit_backlog(ctx: DrillContext, point: str, fault: str, n: int = BATCH_JOBS) -> list[str]:
    """Submit ``n`` small exports while the publisher is paused, inject ``fault`` once at
    failpoint ``point`` (the drill's fault), then resume the publisher: the claims of its
    messages take the backlog as batches."""
    ev = ctx.ev
    pub = ctx.env.proc("publisher")
    pub.signal(signal.SIGSTOP, group=True)
    ctx.defer("publisher resumed", lambda: pub.signal(signal.SIGCONT, group=True))
    jobs = [ctx.submit(ctx.small(2), role=f"batch-{i}") for i in range(n)]
    ctx.inject(point, fault)
    pub.signal(signal.SIGCONT, group=True)
    ev.note("backlog submitted while the publisher was paused; publisher resumed", jobs=n)
    return jobs


def _batches(ctx: DrillContext, jobs: list[str], timeout: float = 30) -> list[list[str]]:
    """The jobs grouped by the claim statement that took them (one first-claim time each),
    once every job was claimed at least once."""

    def grouped() -> list[list[str]] | None:
        rows = [ctx.env.db.job(j) for j in jobs]
        if any(r["started_at"] is None for r in rows):
            return None
        by: dict[Any, list[str]] = defaultdict(list)
        for r in rows:
            by[r["started_at"]].append(str(r["id"]))
        return sorted(by.values(), key=len, reverse=True)

    groups: list[list[str]] = wait_for(grouped, timeout, "every job of the backlog to be claimed")
    ctx.ev.observe("batches", groups)
    ctx.ev.check(
        "the backlog travelled in batches (a claim statement took several jobs)",
        len(groups[0]) > 1,
        groups,
    )
    return groups


def _stalled_batch(ctx: DrillContext, jobs: list[str], pid: int) -> list[str]:
    """The batch the stalled child ``pid`` holds: the jobs still running once every other
    job has ended (the other child's batch is not stalled)."""
    env = ctx.env

    def held() -> list[str] | None:
        rows = [env.db.job(j) for j in jobs]
        running = [r for r in rows if r["status"] == "running"]
        settled = all(r["status"] == "running" or r["status"] in TERMINAL for r in rows)
        one_claim = len({r["started_at"] for r in running}) == 1
        return [str(r["id"]) for r in running] if running and settled and one_claim else None

    batch: list[str] = wait_for(held, 30, "the other batch to finish")
    ctx.ev.observe("stalled_batch", {"pid": pid, "jobs": batch})
    return batch


def _succeeded_once(ctx: DrillContext, jobs: list[str], label: str) -> None:
    env, ev = ctx.env, ctx.ev
    counts = {j: kinds(env.db.history(j)).count("succeeded") for j in jobs}
    ev.check(f"{label}: every job succeeded exactly once", set(counts.values()) == {1}, counts)


@drill(
    "sigkill_worker_mid_batch",
    title="SIGKILL of the worker child in the middle of a batch of small exports",
    group="process",
)
def sigkill_worker_mid_batch(ctx: DrillContext) -> None:
    env, ev = ctx.env, ctx.ev
    jobs = _submit_backlog(ctx, "render.chunk", "sleep:60")
    hit = ctx.wait_injections()[0]
    _batches(ctx, jobs)
    batch = _stalled_batch(ctx, jobs, hit["pid"])
    ev.check("the stalled child holds a batch", len(batch) > 1, batch)
    env.signal_child("fast-worker", hit["pid"], signal.SIGKILL)
    killed_at = ev.note("SIGKILL sent to the child holding the batch", pid=hit["pid"])
    ev.fault = {"signal": "SIGKILL", "pid": hit["pid"], "batch": batch}
    wait_for(lambda: not pid_alive(hit["pid"]), 10, "the child to die")
    for job in batch:
        lease_recovery(ctx, job, killed_at, f"job {job[:8]} of the killed batch")
    _succeeded_once(ctx, jobs, "the whole backlog")


@drill(
    "stale_finish_in_batch",
    title="a worker stalls before finishing its batch; the batch's finish arrives stale",
    group="process",
)
def stale_finish_in_batch(ctx: DrillContext) -> None:
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    stall = round(s.lease_seconds * 2 + 2, 1)
    jobs = _submit_backlog(ctx, "worker.before_finish", f"sleep:{stall}")
    ctx.wait_injections()
    groups = _batches(ctx, jobs)
    tokens = {j: str(env.db.job(j)["lease_token"]) for j in jobs}
    rows = {
        j: env.db.wait_terminal(j, stall + finish_budget(s.lease_recovery_budget) + 30)
        for j in jobs
    }
    _succeeded_once(ctx, jobs, "after the stale batch finish")
    recovered = [j for j in jobs if len(claim_events(env.db.history(j))) == 2]
    ev.observe("recovered_jobs", recovered)
    stale = next((g for g in groups if set(g) <= set(recovered)), None)
    ev.check(
        "a whole batch lost its leases during the stall and was claimed again",
        stale is not None,
        groups,
    )

    def refused() -> list[dict[str, Any]]:
        return [
            r
            for j in stale or []
            for r in stopped_unpublished(ctx, j, tokens[j])
            if r.get("why") == "finish refused"
        ]

    late = wait_for(
        lambda: len(refused()) == len(stale or []) and refused(),
        stall + 30,
        "the stale finish of every job of the batch to be refused",
    )
    ev.observe("stale_finish_logs", late)
    for j in stale or []:
        done = [e for e in env.db.history(j) if e["kind"] == "succeeded"]
        ev.check(
            f"job {j[:8]}: succeeded under the new token, the stale artifact is gone",
            [str(e["lease_token"]) for e in done] != [tokens[j]]
            and [o["key"] for o in env.artifacts_of(rows[j]["tenant_id"], j)]
            == [rows[j]["result_ref"]],
            {"done": done, "result_ref": rows[j]["result_ref"]},
        )


@drill(
    "cancel_one_of_batch",
    title="one export of a batch is cancelled while the batch runs",
    group="process",
)
def cancel_one_of_batch(ctx: DrillContext) -> None:
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    stall = round(max(1.5, s.lease_seconds * 0.75), 2)
    jobs = _submit_backlog(ctx, "render.chunk", f"sleep:{stall}")
    hit = ctx.wait_injections()[0]
    _batches(ctx, jobs)
    batch = _stalled_batch(ctx, jobs, hit["pid"])
    victim = batch[-1]
    with ctx.tenant.api.http() as c:
        r = c.post(f"/v1/exports/{victim}/cancel")
    ev.note("cancel requested for one job of the stalled batch", job=victim, status=r.status_code)
    ev.check_eq("cancel answered 202", r.status_code, 202)
    rows = {j: env.db.wait_terminal(j, stall + s.lease_recovery_budget + 30) for j in jobs}
    ev.check_eq("the cancelled job ended cancelled", rows[victim]["status"], "cancelled")
    seen = env.db.kinds(victim)
    ev.check(
        "its history: cancel_requested then cancelled, no success",
        "cancel_requested" in seen and seen[-1] == "cancelled" and "succeeded" not in seen,
        seen,
    )
    ev.check(
        "nothing of it is in the store",
        not env.artifacts_of(rows[victim]["tenant_id"], victim),
        env.artifacts_of(rows[victim]["tenant_id"], victim),
    )
    others = [j for j in jobs if j != victim]
    ev.check(
        "its neighbours (same batch and the other) succeeded with one claim each",
        all(rows[j]["status"] == "succeeded" and rows[j]["attempts"] == 1 for j in others),
        {j: (rows[j]["status"], rows[j]["attempts"]) for j in others},
    )


@drill(
    "publisher_killed_after_batch_send",
    title="the publisher dies between the batched send and the one mark statement",
    group="process",
)
def publisher_killed_after_batch_send(ctx: DrillContext) -> None:
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    pub = ctx.keep_running("publisher")
    pid = pub.pid
    jobs = _submit_backlog(ctx, "publisher.after_send", "exit")
    code = wait_exit(pub, 30, "the publisher to die after sending")
    hits = ctx.injections()
    ev.check_eq("the publisher died at the failpoint", (code, pid), (137, hits[0]["pid"]))
    unmarked = [j for j in jobs if env.db.outbox(j)[0]["sent_at"] is None]
    ev.check_eq("every event of the batch was sent but none is marked", len(unmarked), len(jobs))
    _batches(ctx, jobs)
    first = {j: env.db.wait_terminal(j, 60) for j in jobs}
    env.start_process("publisher")
    ev.note("publisher restarted", pid=pub.pid)
    for j in jobs:

        def marked(j: str = j) -> bool:
            return bool(env.db.outbox(j)[0]["sent_at"] is not None)

        wait_for(
            marked,
            s.publisher_claim_seconds + 30,
            f"job {j[:8]}'s event to be published again and marked",
        )
    for j in jobs:
        history = env.db.history(j)
        ev.check_eq(
            f"job {j[:8]}: one claim, one success, one dispatched event; result untouched",
            (
                [kinds(history).count(k) for k in ("claimed", "succeeded", "dispatched")],
                env.db.job(j)["result_ref"],
            ),
            ([1, 1, 1], first[j]["result_ref"]),
        )
        ev.check_eq(
            f"job {j[:8]}: its event was published twice",
            env.db.outbox(j)[0]["publish_attempts"],
            2,
        )
