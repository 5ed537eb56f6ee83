"""The failure matrix of the course's last lesson, one drill per row, on the real processes.

Each drill uses a fresh job (its own tenant), injects one fault, restores, and checks what
the database, the broker, the worker logs and the artifact store show afterwards.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any
from uuid import UUID, uuid4

import httpx

from devtools.drills.checks import (
    check_not_restarted,
    claim_events,
    kinds,
    lease_recovery,
    processes,
    redispatch_checks,
    stopped_unpublished,
    table_counts,
)
from devtools.drills.evidence import log_time, seconds_between
from devtools.drills.harness import parent_of, wait_exit, wait_for
from devtools.drills.load import (
    Attempt,
    Sampler,
    check_answers,
)
from devtools.drills.registry import DrillContext, drill
from exportcore.artifacts import artifact_key
from exportcore.broker import TICK_TASK
from exportcore.db import make_pool
from exportcore.domain import FAST_QUEUE, ExportFormat
from exportcore.schedules.ticker import ScheduleTicker

# --- DB事务提交前 -------------------------------------------------------------------------------


@drill(
    "submit_rollback",
    title="the submit transaction fails right before COMMIT: nothing of it remains",
    group="matrix",
    matrix_row="DB事务提交前: job and outbox roll back together",
    ci=True,
)
def submit_rollback(ctx: DrillContext) -> None:
    env, ev, tenant = ctx.env, ctx.ev, ctx.tenant
    key = f"rollback-{uuid4().hex}"
    before = table_counts(ctx)
    ctx.inject("submit.before_commit", "db")
    r = tenant.api.submit(ctx.small(2), key=key)
    ev.note("submit answered", status=r.status_code, body=r.text[:300])
    hits = ctx.injections()
    api_pid = env.proc("api").pid
    ev.check(
        "the fault was injected once, in a gunicorn worker of our api",
        len(hits) == 1 and parent_of(hits[0]["pid"]) == api_pid,
        f"hits {hits}, api master {api_pid}",
    )
    ev.check_eq("the failed submit answered 503", r.status_code, 503)
    ev.check(
        "the answer is a problem+json with Retry-After",
        r.headers.get("content-type", "").startswith("application/problem+json")
        and bool(r.headers.get("retry-after")),
        dict(r.headers),
    )
    after = table_counts(ctx)
    ev.observe("rows_before", before)
    ev.observe("rows_after_failed_submit", after)
    ev.check_eq(
        "nothing was written: job, outbox, history, snapshot, idempotency key", after, before
    )
    again = tenant.api.submit(ctx.small(2), key=key)
    ev.check_eq(
        "the same Idempotency-Key then makes a NEW job (its reservation had rolled back)",
        (again.status_code, again.headers.get("idempotent-replayed")),
        (202, None),
    )
    if again.status_code != 202:
        return
    job_id = ev.track(again.json()["id"], "resubmitted with the same key")
    row = env.db.wait_terminal(job_id, 60)
    ev.check_eq("the resubmitted export succeeded", row["status"], "succeeded")
    final = table_counts(ctx)
    ev.check_eq(
        "exactly one job and one outbox event were added by the resubmit",
        (
            final["export_jobs"] - before["export_jobs"],
            final["export_outbox"] - before["export_outbox"],
        ),
        (1, 1),
    )


# --- broker不可用 ------------------------------------------------------------------------------


@drill(
    "broker_down_at_submit",
    title="Redis is down when an export is submitted",
    group="matrix",
    matrix_row="broker不可用: job and outbox kept, sent_at empty",
    ci=True,
)
def broker_down_at_submit(ctx: DrillContext) -> None:
    env, ev = ctx.env, ctx.ev
    procs = processes(ctx)
    pid = env.redis_pid()
    env.servers.stop_redis()
    ctx.defer("redis running", env.ensure_redis)
    wait_for(lambda: not env.redis_up(), 10, "redis to be down")
    ev.fault = {"kind": "broker down (redis-cli shutdown nosave)", "redis_pid": pid}
    t_down = ev.note("redis stopped", pid=pid)
    job = ctx.submit(ctx.small(2), role="submitted while the broker was down")
    t_accepted = ev.note("submit answered 202", job_id=job)
    ev.check("the api accepted the export with the broker down", True, f"202 for {job}")
    ev.check_eq("the job's outbox event was committed with it", len(env.db.outbox(job)), 1)
    failing = wait_for(
        lambda: (o := env.db.outbox(job)[0])["publish_attempts"] >= 2 and o["last_error"] and o,
        30,
        "the publisher to fail to publish twice",
    )
    row = env.db.job(job)
    ev.observe("outbox_while_down", failing)
    ev.check(
        "while Redis is down the event stays unsent and the job queued with no attempt used",
        failing["sent_at"] is None and row["status"] == "queued" and row["attempts"] == 0,
        f"sent_at {failing['sent_at']}, status {row['status']}, attempts {row['attempts']}",
    )
    env.servers.start_redis()
    t_up = ev.note(
        "redis started", pid=env.redis_pid(), down_seconds=round(time.time() - t_down, 2)
    )
    row = env.db.wait_terminal(job, 120)
    ev.check_eq("the export succeeded once Redis was back", row["status"], "succeeded")
    history = env.db.history(job)
    claim = claim_events(history)
    ob = env.db.outbox(job)[0]
    ev.recovery_seconds["broker_up_to_claimed"] = seconds_between(
        t_up, claim[0]["at"] if claim else None
    )
    ev.recovery_seconds["accepted_to_succeeded"] = seconds_between(t_accepted, row["finished_at"])
    names = kinds(history)
    first_redispatch = names.index("redispatched") if "redispatched" in names else len(names)
    ev.check(
        "published once when Redis was back: the submit's event sent once (one dispatch "
        "before any redispatch), the job claimed once (attempts 1)",
        names[:first_redispatch].count("dispatched") == 1
        and row["attempts"] == 1
        and ob["sent_at"] is not None,
        f"history {names}, publish attempts {ob['publish_attempts']}",
    )
    if first_redispatch < len(names):
        # A worker reconnecting to the restarted Redis (kombu's backoff) may take longer than
        # the drill's short DISPATCH_THRESHOLD_SECONDS to consume again: then the scanner
        # re-dispatches, as it must, but never before the threshold, and the duplicate
        # message is refused by the job claim (attempts stay 1, checked above).
        dispatched = next(e for e in history if e["kind"] == "dispatched")
        redispatched = history[first_redispatch]
        waited = seconds_between(dispatched["at"], redispatched["at"]) or 0.0
        threshold = env.settings.dispatch_threshold_seconds
        ev.check(
            "a redispatch came only after the dispatch threshold passed with no claim",
            waited >= threshold - 0.05 and "claimed" not in names[:first_redispatch],
            f"{waited} s after the dispatch, threshold {threshold} s",
        )
    check_not_restarted(ctx, procs)


# --- 发布后未标sent -----------------------------------------------------------------------------


@drill(
    "publish_not_marked_sent",
    title="the publisher dies after sending, before marking the event sent",
    group="matrix",
    matrix_row="发布后未标sent: published again, the result stays protected by the CAS",
    ci=True,
)
def publish_not_marked_sent(ctx: DrillContext) -> None:
    """A worker's claim marks the event of the message it received sent
    (``outbox_mark_delivered``), so a message that reaches a worker needs no second publish.
    The case this drill covers is the message still waiting in the broker when its publisher
    dies: the fast worker is frozen (SIGSTOP of its process group) until the restarted
    publisher has sent the event again, then both deliveries reach it."""
    env, ev = ctx.env, ctx.ev
    pub = ctx.keep_running("publisher")
    pid = pub.pid
    worker = ctx.keep_running("fast-worker")
    worker.signal(signal.SIGSTOP, group=True)
    ctx.defer("fast-worker thawed", lambda: worker.signal(signal.SIGCONT, group=True))
    ev.note("fast-worker frozen", pid=worker.pid)
    ctx.inject("publisher.after_send", "exit", publisher_pid=pid)
    job = ctx.submit(ctx.small(2))
    code = wait_exit(pub, 30, "the publisher to die after sending")
    hits = ctx.injections()
    ev.note("publisher died", exit_code=code)
    ev.check(
        "the publisher we started died at the failpoint (exit 137)",
        code == 137 and [h["pid"] for h in hits] == [pid],
        f"exit {code}, hits {hits}",
    )
    ob = env.db.outbox(job)[0]
    ev.observe("outbox_after_crash", ob)
    ev.check(
        "the event was sent but is not marked sent",
        ob["sent_at"] is None and ob["publish_attempts"] == 1,
        f"sent_at {ob['sent_at']}, publish_attempts {ob['publish_attempts']}",
    )
    env.start_process("publisher")
    ev.note("publisher restarted", pid=pub.pid)
    sent = wait_for(
        lambda: (o := env.db.outbox(job)[0])["sent_at"] is not None and o,
        ctx.settings.publisher_claim_seconds + 30,
        "the event to be published again and marked sent",
    )
    ev.check_eq("the same event was published a second time", sent["publish_attempts"], 2)
    worker.signal(signal.SIGCONT, group=True)
    ev.note("fast-worker thawed")
    first = env.db.wait_terminal(job, 60)
    ev.check_eq("one of the two deliveries ran the export", first["status"], "succeeded")
    message_id = str(sent["id"])
    refusals = wait_for(
        lambda: [r for r in env.logs.refusals(job) if r.get("message_id") == message_id],
        30,
        "the second delivery of the message to be refused",
    )
    ev.duplicate_deliveries = {
        "message_id": message_id,
        "deliveries_seen": 1 + len(refusals),
        "claim_refusals": refusals,
    }
    ev.check(
        "the second delivery of the same message id was refused",
        refusals[0].get("reason") in ("terminal", "leased"),
        refusals,
    )
    history = env.db.history(job)
    now = env.db.job(job)
    ev.check_eq(
        "the result was not touched by the duplicate", now["result_ref"], first["result_ref"]
    )
    ev.check_eq(
        "one claim, one success, one dispatched event",
        [kinds(history).count(k) for k in ("claimed", "succeeded", "dispatched")],
        [1, 1, 1],
    )


# --- worker持租约退出 ----------------------------------------------------------------------------


@drill(
    "worker_exit_holding_lease",
    title="the prefork child running an export exits on the spot holding the lease",
    group="matrix",
    matrix_row="worker持租约退出: recovered at lease expiry, attempts incremented",
    ci=True,
)
def worker_exit_holding_lease(ctx: DrillContext) -> None:
    env, ev = ctx.env, ctx.ev
    children = env.children_of("fast-worker")
    ctx.inject("render.chunk", "exit", effect="os._exit(137) in the child")
    job = ctx.submit(ctx.small(3))
    hit = ctx.wait_injections()[0]
    ev.check(
        "the child that died was a prefork child of our fast-worker",
        hit["pid"] in children,
        f"pid {hit['pid']}, children {children}",
    )
    lease_recovery(ctx, job, hit["at"], "after the child's exit")


# --- 旧token晚到 --------------------------------------------------------------------------------


@drill(
    "late_finish_old_token",
    title="a stalled worker finishes with its old token after another worker claimed the job",
    group="matrix",
    matrix_row="旧token晚到: finish=False, result_ref unchanged",
    ci=False,  # make drills only: the CI budget (a similar drill runs in CI)
)
def late_finish_old_token(ctx: DrillContext) -> None:
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    stall = round(s.lease_seconds * 2 + 2, 1)
    ctx.inject("worker.before_finish", f"sleep:{stall}")
    job = ctx.submit(ctx.small(3))
    hit = ctx.wait_injections()[0]
    token1 = str(env.db.job(job)["lease_token"])
    ev.note("the first holder stalls before its finish", pid=hit["pid"], lease_token=token1)
    claims = env.db.wait_event(job, "claimed", stall + 30, count=2)
    token2 = str(claims[1]["lease_token"])
    ev.note("a new claim", lease_token=token2)

    late = wait_for(
        lambda: stopped_unpublished(ctx, job, token1),
        stall + 30,
        "the old holder's finish to be refused",
    )[0]
    row = env.db.wait_terminal(job, 60)
    history = env.db.history(job)
    done = [e for e in history if e["kind"] == "succeeded"]
    ev.observe("late_finish_log", late)
    ev.check(
        "the old holder's finish CAS was refused, after the new claim",
        late.get("why") == "finish refused"
        and (log_time(late) or 0) >= claims[1]["at"].timestamp() - 0.01,
        late,
    )
    ev.check_eq(
        "the job succeeded under the new token only",
        [str(e["lease_token"]) for e in done],
        [token2],
    )
    ev.check(
        "result_ref is the new token's artifact",
        token2 in (row["result_ref"] or ""),
        row["result_ref"],
    )
    ext = ExportFormat(row["format"]).extension
    old_key = artifact_key(row["tenant_id"], row["id"], UUID(token1), ext)
    stored = env.artifacts_of(row["tenant_id"], job)
    ev.observe("stored_objects", stored)
    ev.check(
        "the old token's artifact was deleted by its own writer; only the winner's remains",
        [o["key"] for o in stored] == [row["result_ref"]]
        and old_key not in [o["key"] for o in stored],
        stored,
    )


# --- 取消 --------------------------------------------------------------------------------------


@drill(
    "cancel_running",
    title="a running export is cancelled",
    group="matrix",
    matrix_row="取消: ends cancelled, nothing published",
    ci=True,
    s3=True,
)
def cancel_running(ctx: DrillContext) -> None:
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    stall = round(max(1.5, s.lease_seconds * 0.75), 2)
    ctx.inject("render.chunk", f"sleep:{stall}", effect="holds the job running")
    job = ctx.submit(ctx.small(3))
    ctx.wait_injections()
    with ctx.tenant.api.http() as c:
        r = c.post(f"/v1/exports/{job}/cancel")
        shown = ctx.tenant.api.status(job, c)
    t_cancel = ev.note("cancel requested", status=r.status_code)
    body = r.json()
    ev.check(
        "cancel answered 202 and the status still says running (with cancel_requested)",
        r.status_code == 202 and body["status"] == "running" and body["cancel_requested"],
        body,
    )
    ev.check(
        "GET shows running + cancel_requested, never cancelled early",
        shown["status"] == "running" and shown["cancel_requested"],
        {k: shown.get(k) for k in ("status", "cancel_requested")},
    )
    row = env.db.wait_terminal(job, stall + s.lease_seconds + 30)
    ev.recovery_seconds["cancel_to_cancelled"] = seconds_between(t_cancel, row["finished_at"])
    ev.check_eq("the export ended cancelled", row["status"], "cancelled")
    seen = env.db.kinds(job)
    ev.check(
        "history: cancel_requested then cancelled, no success",
        "cancel_requested" in seen and seen[-1] == "cancelled" and "succeeded" not in seen,
        seen,
    )
    stored = env.artifacts_of(row["tenant_id"], job)
    ev.check("nothing of the export is left in the store", not stored, stored)


# --- 次数耗尽 ---------------------------------------------------------------------------------


@drill(
    "attempts_exhausted",
    title="every attempt dies holding the lease until no attempt is left",
    group="matrix",
    matrix_row="次数耗尽: failed and dead letter, no extra claim",
    ci=False,  # make drills only: the CI budget (a similar drill runs in CI)
)
def attempts_exhausted(ctx: DrillContext) -> None:
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    n = s.max_attempts
    ctx.inject("render.chunk", "exit", n)
    job = ctx.submit(ctx.small(2))
    row = env.db.wait_terminal(job, n * (s.lease_recovery_budget + 15) + 30)
    hits = ctx.injections()
    history = env.db.history(job)
    claims = claim_events(history)
    ev.check_eq("the export failed", row["status"], "failed")
    ev.check_eq("the reason is attempts_exhausted", row["error_code"], "attempts_exhausted")
    ev.check(
        f"{n} claims with {n} distinct lease tokens, {n} worker deaths",
        len(claims) == n
        and len({c["lease_token"] for c in claims}) == n
        and len({h["pid"] for h in hits}) == n,
        f"claims {len(claims)}, deaths {[h['pid'] for h in hits]}",
    )
    dead = env.db.sql("SELECT reason, attempts FROM export_dead_letters WHERE job_id = %s", (job,))
    with ctx.tenant.api.http() as c:
        listed = c.get(
            "/v1/admin/dead-letters", params={"limit": 50}, headers=ctx.tenant.api.admin
        ).json()
    ev.check(
        "a dead letter records it, and operators see it in /v1/admin/dead-letters",
        dead == [{"reason": "attempts_exhausted", "attempts": n}]
        and job in [d["job_id"] for d in listed.get("items", [])],
        dead,
    )
    duplicate = env.send_duplicate(job, row["queue"])
    ev.note("a late message for the failed job sent to the broker", message_id=duplicate)
    refusal = wait_for(
        lambda: [r for r in env.logs.refusals(job) if r.get("message_id") == duplicate],
        30,
        "the late message to be refused",
    )[0]
    after = env.db.job(job)
    ev.duplicate_deliveries = {
        "claim_refusals": [
            {"reason": r.get("reason"), "message_id": r.get("message_id")}
            for r in env.logs.refusals(job)
        ]
    }
    ev.check_eq("the late message was refused as terminal", refusal.get("reason"), "terminal")
    ev.check_eq(
        "no further claim: attempts and claims stay at the maximum",
        (after["attempts"], len(claim_events(env.db.history(job))), after["status"]),
        (n, n, "failed"),
    )


# --- 队列满 -----------------------------------------------------------------------------------


async def _burst(
    url: str, bodies: list[tuple[str, dict[str, Any]]], headers: dict[str, str]
) -> list[Attempt]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:

        async def one(key: str, body: dict[str, Any]) -> Attempt:
            a = Attempt(key=key, body=body, sent_at=time.time())
            try:
                r = await client.post(url, json=body, headers={**headers, "Idempotency-Key": key})
                a.status, a.content_type = r.status_code, r.headers.get("content-type")
                a.retry_after = r.headers.get("retry-after")
                if r.status_code == 202:
                    a.job_id = str(r.json()["id"])
                else:
                    a.problem = str(r.json().get("type", "")).rsplit("/", 1)[-1]
            except httpx.HTTPError as exc:
                a.error = type(exc).__name__
            a.done_at = time.time()
            return a

        return await asyncio.gather(*(one(k, b) for k, b in bodies))


@drill(
    "queue_full",
    title="a burst of concurrent submits against a small capacity",
    group="matrix",
    matrix_row="队列满: 503 and no false 202",
    ci=True,
)
def queue_full(ctx: DrillContext) -> None:
    env, ev = ctx.env, ctx.ev
    capacity, burst = 4, 40
    env.restart_with("api", ADMISSION_CAPACITY=str(capacity))
    ctx.defer("api with its normal capacity", lambda: env.restore_env("api"))
    ev.fault = {
        "kind": "admission capacity lowered (api restarted)",
        "ADMISSION_CAPACITY": capacity,
    }
    sampler = Sampler(env.active_jobs, interval=0.02).start()
    bodies = [(f"full-{uuid4().hex}", ctx.bulk("ndjson")) for _ in range(burst)]
    attempts = asyncio.run(_burst(env.api_url + "/v1/exports", bodies, ctx.tenant.api.auth))
    samples = sampler.stop()
    accepted = [a for a in attempts if a.status == 202]
    for a in accepted:
        ev.track(a.job_id, "accepted from the burst")
    peak = max((v for _, v in samples if isinstance(v, int)), default=None)
    ev.observe("active_jobs_peak", peak)
    ev.observe("active_job_samples", len(samples))
    ev.check(
        "the burst met a full capacity: some 202, some 503",
        bool(accepted) and any(a.status == 503 for a in attempts),
        [a.status for a in attempts],
    )
    check_answers(ev, env, ctx.tenant, attempts, {"503 capacity_exceeded"})
    ev.check(
        "active jobs never exceeded the capacity (sampled every 20 ms during the burst)",
        peak is not None and peak <= capacity,
        f"peak {peak}, capacity {capacity}",
    )
    for a in accepted:
        assert a.job_id is not None
        env.db.wait_terminal(a.job_id, 120)


# --- 同槽周期重复 ------------------------------------------------------------------------------


@drill(
    "duplicate_schedule_slot",
    title="many ticks race on one due schedule slot",
    group="matrix",
    matrix_row="同槽周期重复: one periodic job per slot",
    ci=True,
)
def duplicate_schedule_slot(ctx: DrillContext) -> None:
    env, ev, tenant = ctx.env, ctx.ev, ctx.tenant
    with tenant.api.http() as c:
        r = c.post(
            "/v1/schedules",
            json={
                "name": "drill",
                "interval_seconds": 3600,
                "note_ids": tenant.note_ids[:2],
                "format": "json",
                "catch_up": "skip",
            },
        )
    if r.status_code != 201:
        raise AssertionError(f"schedule create answered {r.status_code}: {r.text}")
    schedule = r.json()

    def delete() -> None:
        with tenant.api.http() as c:
            c.delete(f"/v1/schedules/{schedule['id']}")

    ctx.defer("schedule deleted", delete)
    tickers, broker_ticks = 6, 6
    settings = env.core_settings()
    pool = make_pool(settings, "drills-ticker", min_size=tickers, max_size=tickers, open_wait=True)
    ctx.defer("ticker pool closed", pool.close)
    ticker = ScheduleTicker(settings, pool)
    barrier = threading.Barrier(tickers)
    results: list[dict[str, int]] = []
    since = {n: env.log_offset(n) for n in ("fast-worker",)}

    def run() -> None:
        barrier.wait()
        results.append(ticker.tick().as_dict())

    # Make its first slot due now (the schedule's cursor moves, like a job's timestamps).
    slot = env.db.one(
        "UPDATE export_schedules SET next_due_at = date_trunc('second', now()) - interval '1 s'"
        " WHERE id = %s RETURNING next_due_at",
        (schedule["id"],),
    )["next_due_at"]
    ev.fault = {
        "kind": "concurrent ticks on one due slot",
        "in_process_tickers": tickers,
        "broker_ticks": broker_ticks,
        "slot": slot,
    }
    threads = [threading.Thread(target=run) for _ in range(tickers)]
    for t in threads:
        t.start()
    for _ in range(broker_ticks):
        env.celery().send_task(TICK_TASK, queue=FAST_QUEUE)
    for t in threads:
        t.join(30)
    slots = wait_for(
        lambda: env.db.sql(
            "SELECT scheduled_at, outcome, job_id FROM export_schedule_slots"
            " WHERE schedule_id = %s",
            (schedule["id"],),
        ),
        30,
        "the slot to be recorded",
    )
    jobs = env.db.sql(
        "SELECT job_id FROM export_job_events WHERE kind = 'submitted'"
        " AND detail->>'schedule_id' = %s",
        (schedule["id"],),
    )
    for j in jobs:
        ev.track(j["job_id"], "created by the slot")
    ev.observe("in_process_tick_results", results)
    ev.observe("slots", slots)
    ev.check_eq("all in-process tickers ran", len(results), tickers)
    ev.check_eq(
        "exactly one slot row, for the due instant, outcome created",
        [(s["scheduled_at"], s["outcome"]) for s in slots],
        [(slot, "created")],
    )
    ev.check_eq("exactly one export was created for the slot", len(jobs), 1)
    created_here = sum(r["created"] for r in results)
    worker_ticks = [
        r
        for r in env.proc("fast-worker").log_text()[since["fast-worker"] :].splitlines()
        if "schedules advanced" in r
    ]
    ev.observe("worker_tick_logs", worker_ticks)
    ev.check(
        "one ticker created it; every other tick found the slot handled",
        created_here + len(worker_ticks) >= 1 and len(jobs) == 1,
        f"in-process created {created_here}, worker ticks that advanced {len(worker_ticks)}",
    )
    if jobs:
        row = env.db.wait_terminal(str(jobs[0]["job_id"]), 60)
        ev.check_eq("the slot's export succeeded", row["status"], "succeeded")
    cursor = env.db.one("SELECT next_due_at FROM export_schedules WHERE id = %s", (schedule["id"],))
    ev.check_eq(
        "the cursor moved on by exactly one interval",
        seconds_between(slot, cursor["next_due_at"]),
        3600.0,
    )


# --- 已派发但未领取 ------------------------------------------------------------------------------


@drill(
    "sent_never_claimed",
    title="a message that was sent vanishes from the broker before any worker takes it",
    group="matrix",
    matrix_row="已派发但未领取: the scanner re-dispatches, the job completes",
    ci=True,
)
def sent_never_claimed(ctx: DrillContext) -> None:
    env, ev = ctx.env, ctx.ev
    # beat's schedule ticks also travel on exports.fast: with nobody consuming they would
    # pile up beside the export's message, which this drill finds and removes by hand
    for name in ("beat", "fast-worker"):
        code = ctx.stop(name)
        ev.note(f"{name} stopped", exit_code=code)
    ticks = [m for m in env.queued_messages(FAST_QUEUE) if m["task"] == TICK_TASK]
    for m in ticks:
        env.redis().lrem(FAST_QUEUE, 1, m["raw"])
    ev.note("nobody consumes exports.fast; waiting schedule ticks removed", ticks=len(ticks))
    ev.check(
        "exports.fast is empty before the submit",
        not env.queued_messages(FAST_QUEUE),
        env.queued_messages(FAST_QUEUE),
    )
    job = ctx.submit(ctx.small(2))
    dispatched = env.db.wait_event(job, "dispatched", 30)[0]
    message_id = str(dispatched["message_id"])
    waiting = wait_for(
        lambda: [m for m in env.queued_messages(FAST_QUEUE) if m["id"] == message_id],
        10,
        "the sent message to sit in Redis",
    )
    removed = env.redis().lrem(FAST_QUEUE, 1, waiting[0]["raw"])
    lost_at = ev.note(
        "the message was removed from the broker", message_id=message_id, removed=removed
    )
    ev.fault = {"kind": "a sent message removed from Redis (LREM)", "message_id": message_id}
    ev.check_eq("exactly that message was removed from Redis", removed, 1)
    row = env.db.job(job)
    ev.check(
        "the job is queued, marked dispatched, attempts 0",
        row["status"] == "queued" and row["dispatch_count"] == 1 and row["attempts"] == 0,
        {k: row[k] for k in ("status", "dispatch_count", "attempts")},
    )
    env.start_process("fast-worker")
    redispatch_checks(ctx, job, lost_at)


# --- claim之前失败 ----------------------------------------------------------------------------


@drill(
    "failure_before_claim",
    title="the worker loses its database connection before claiming",
    group="matrix",
    matrix_row="claim之前失败: the queued path re-dispatches",
    ci=True,
    s3=True,
)
def failure_before_claim(ctx: DrillContext) -> None:
    env, ev = ctx.env, ctx.ev
    children = env.children_of("fast-worker")
    ctx.inject("worker.before_claim", "db")
    job = ctx.submit(ctx.small(2))
    hit = ctx.wait_injections()[0]
    ev.check("the fault hit a prefork child of our fast-worker", hit["pid"] in children, hit)
    row = env.db.job(job)
    ev.check(
        "the delivery failed before claiming: queued, attempts 0",
        row["status"] == "queued" and row["attempts"] == 0,
        {k: row[k] for k in ("status", "attempts", "dispatch_count")},
    )
    redispatch_checks(ctx, job, hit["at"])


# --- 退避期间重复消息 ---------------------------------------------------------------------------


@drill(
    "duplicate_during_backoff",
    title="duplicate messages arrive while the job waits out its retry backoff",
    group="matrix",
    matrix_row="退避期间重复消息: all refused, attempts unchanged",
    ci=True,
)
def duplicate_during_backoff(ctx: DrillContext) -> None:
    env, ev = ctx.env, ctx.ev
    stall = 3.0
    env.arm("render.chunk", f"sleep:{stall}", 1)
    ctx.inject(
        "artifact.commit",
        "io",
        effect="EIO: a transient storage error",
        positioning=f"render.chunk sleep:{stall} while the publisher is stopped",
    )
    job = ctx.submit(ctx.small(2))
    env.wait_hits("render.chunk", 1, 30)
    code = ctx.stop("publisher")
    ev.note(
        "publisher stopped while attempt 1 renders (its retry event stays pending)", exit_code=code
    )
    retried = env.db.wait_event(job, "retried", stall + 30)[0]
    # The backoff the policy drew is under a second: widen it for this job only (the course
    # sets next_attempt_at in the future the same way), so duplicates surely arrive in it.
    moved = env.db.one(
        "UPDATE export_jobs SET next_attempt_at = now() + interval '60 seconds'"
        " WHERE id = %s AND status = 'queued' AND attempts = 1 RETURNING next_attempt_at",
        (job,),
    )
    env.db.sql(
        "UPDATE export_outbox SET available_at = %s WHERE job_id = %s AND sent_at IS NULL",
        (moved["next_attempt_at"], job),
    )
    ev.note("backoff widened", retried=retried["detail"], next_attempt_at=moved["next_attempt_at"])
    duplicates = [env.send_duplicate(job, FAST_QUEUE) for _ in range(3)]
    ev.note("three duplicate messages sent", message_ids=duplicates)
    refusals = wait_for(
        lambda: (
            (rs := [r for r in env.logs.refusals(job) if r.get("message_id") in duplicates])
            and len(rs) == 3
            and rs
        ),
        30,
        "the three duplicates to be refused",
    )
    during = env.db.job(job)
    ev.duplicate_deliveries = {
        "duplicates_sent": duplicates,
        "claim_refusals": [
            {"reason": r.get("reason"), "message_id": r.get("message_id")} for r in refusals
        ],
    }
    ev.check_eq(
        "every duplicate was refused as not due",
        [r.get("reason") for r in refusals],
        ["not_due"] * 3,
    )
    ev.check_eq(
        "attempts and claims unchanged by the duplicates, still queued",
        (during["status"], during["attempts"], len(claim_events(env.db.history(job)))),
        ("queued", 1, 1),
    )
    env.db.sql(
        "UPDATE export_jobs SET next_attempt_at = now() WHERE id = %s AND status = 'queued'", (job,)
    )
    env.db.sql(
        "UPDATE export_outbox SET available_at = now() WHERE job_id = %s AND sent_at IS NULL",
        (job,),
    )
    env.start_process("publisher")
    ev.note("backoff over, publisher restarted")
    row = env.db.wait_terminal(job, 60)
    ev.check_eq(
        "the retry then ran: succeeded on attempt 2",
        (row["status"], row["attempts"]),
        ("succeeded", 2),
    )


# --- pending事件仍在 ----------------------------------------------------------------------------


@drill(
    "pending_event_suppresses_redispatch",
    title="a queued job whose outbox event is still pending is never re-dispatched",
    group="matrix",
    matrix_row="pending事件仍在: no new recovery event while one is pending",
    ci=True,
)
def pending_event_suppresses_redispatch(ctx: DrillContext) -> None:
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    code = ctx.stop("publisher")
    ev.fault = {"kind": "publisher stopped: the outbox event stays pending"}
    ev.note("publisher stopped", exit_code=code)
    job = ctx.submit(ctx.small(2))
    t0 = time.time()
    wait_for(lambda: time.time() - t0 > s.dispatch_threshold_seconds * 1.5, 60, "the threshold")
    passes_at = env.scanner_passes()
    passes = wait_for(
        lambda: (p := env.scanner_passes()) >= passes_at + 3 and p,
        30,
        "three scanner passes past the threshold",
    )
    ev.observe("scanner_passes_past_threshold", passes - passes_at)
    ev.observe("job_age_seconds", round(time.time() - t0, 2))
    history = env.db.history(job)
    outbox = env.db.outbox(job)
    row = env.db.job(job)
    ev.check_eq("no redispatched event", kinds(history).count("redispatched"), 0)
    ev.check_eq("still exactly one outbox event, unsent", [o["sent_at"] for o in outbox], [None])
    ev.check_eq(
        "the job waits queued, never dispatched, no attempt used",
        (row["status"], row["dispatch_count"], row["attempts"]),
        ("queued", 0, 0),
    )
    env.start_process("publisher")
    row = env.db.wait_terminal(job, 60)
    ev.check_eq(
        "once published it ran once: succeeded, one dispatch, one outbox event",
        (row["status"], row["dispatch_count"], len(env.db.outbox(job))),
        ("succeeded", 1, 1),
    )
