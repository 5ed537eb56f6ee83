"""Infrastructure faults: PostgreSQL restarted, Redis restarted or flushed under load, the
artifact storage read-only or full. The servers and the artifact tmpfs are the ones this
environment started and mounted."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from devtools.drills.checks import (
    check_not_restarted,
    claim_events,
    finish_budget,
    kinds,
    processes,
)
from devtools.drills.evidence import seconds_between
from devtools.drills.harness import parse_message, wait_for
from devtools.drills.load import (
    LoadGenerator,
    Sampler,
    check_answers,
    readyz_status,
)
from devtools.drills.registry import DrillContext, drill
from exportcore.domain import QUEUES


def _wait_accepted_after(load: LoadGenerator, since: float, n: int, timeout: float) -> None:
    wait_for(
        lambda: sum(a.sent_at > since for a in load.accepted) >= n,
        timeout,
        f"{n} accepted submits after t={since:.3f}",
    )


def _all_succeeded(ctx: DrillContext, job_ids: list[str], timeout: float) -> None:
    """Wait for every job to end; check that every one succeeded."""
    env, ev = ctx.env, ctx.ev
    deadline = time.monotonic() + timeout
    for j in job_ids:
        env.db.wait_terminal(j, max(1.0, deadline - time.monotonic()))
    rows = env.db.sql(
        "SELECT status, count(*) AS n FROM export_jobs WHERE id = ANY(%s::uuid[]) GROUP BY status",
        (job_ids,),
    )
    ev.check_eq(
        "every accepted export succeeded (nothing accepted was lost)",
        {r["status"]: r["n"] for r in rows},
        {"succeeded": len(job_ids)},
    )


@drill(
    "postgres_restart_under_load",
    title="PostgreSQL stopped and started again while clients submit and workers export",
    group="infra",
    ci=True,
)
def postgres_restart_under_load(ctx: DrillContext) -> None:
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    procs = processes(ctx)
    load = LoadGenerator(env, ctx.tenant, rate=8, threads=6, bulk_share=0.1, seed=3).start()
    ready = Sampler(lambda: readyz_status(env), 0.2).start()
    try:
        wait_for(lambda: len(load.accepted) >= 10, 60, "10 accepted submits before the fault")
        pid = env.postgres_pid()
        env.servers.stop_pg()
        down_at = ev.note("PostgreSQL stopped (pg_ctl stop -m fast)", postmaster_pid=pid)
        ctx.defer("postgresql running", env.ensure_pg)
        ev.fault = {"kind": "PostgreSQL down", "postmaster_pid": pid}
        outage = 4.0
        wait_for(
            lambda: (
                time.time() - down_at >= outage
                and sum(a.sent_at > down_at and a.status == 503 for a in load.attempts) >= 3
            ),
            60,
            f"{outage} s of outage with the api answering 503",
        )
        # PostgreSQL accepts connections before start_pg returns: "while down" ends here
        restart_at = time.time()
        env.servers.start_pg()
        up_at = ev.note("PostgreSQL started", postmaster_pid=env.postgres_pid())
        _wait_accepted_after(load, up_at, 10, 90)
    finally:
        load.stop()
        samples = ready.stop()
    first_ok = min((a.done_at for a in load.accepted if a.sent_at > up_at), default=None)
    ev.recovery_seconds["postgres_up_to_first_202"] = seconds_between(up_at, first_ok)
    ev.recovery_seconds["outage_seconds"] = seconds_between(down_at, up_at)
    during = [a for a in load.attempts if down_at < a.sent_at and a.done_at < restart_at]
    ev.observe("answers_during_outage", sorted({f"{a.status} {a.problem}" for a in during}))
    ev.observe(
        "errors_after_restart_seconds_after_up",
        [
            (round(a.sent_at - up_at, 2), f"{a.status} {a.problem or a.error}")
            for a in load.attempts
            if a.sent_at > up_at and a.status != 202
        ],
    )
    check_answers(ev, env, ctx.tenant, load.attempts, {"503 database_unavailable"})
    ev.check(
        "while PostgreSQL was down the api answered 503 problems, never 500",
        bool(during) and all(a.status == 503 for a in during),
        sorted({f"{a.status} {a.problem}" for a in during}),
    )
    down_ready = {v for t, v in samples if down_at + 1 < t < restart_at}
    ev.check("/readyz said 503 while down", down_ready == {503}, down_ready)
    passes = env.scanner_passes()
    wait_for(lambda: env.scanner_passes() >= passes + 2, 60, "two scanner passes after the restart")
    ev.check("the recovery-scanner runs passes again", True, f"passes {passes} -> more")
    probe = ctx.submit(ctx.small(1), role="probe after the restart")
    probe_row = env.db.wait_terminal(probe, 60)
    ev.check_eq(
        "a probe export went through every process after the restart",
        probe_row["status"],
        "succeeded",
    )
    accepted = [a.job_id for a in load.accepted if a.job_id]
    for j in accepted:
        ev.track(j, "accepted under load")
    _all_succeeded(ctx, accepted, s.lease_recovery_budget + s.dispatch_recovery_budget(99) + 120)
    check_not_restarted(ctx, procs)


@drill(
    "postgres_sigkill_under_load",
    title="every PostgreSQL process SIGKILLed while clients submit and workers export",
    group="infra",
    ci=False,  # make drills only: a crash recovery and a catch-up take the CI budget
)
def postgres_sigkill_under_load(ctx: DrillContext) -> None:
    """The claims commit without waiting for their WAL flush (docs/architecture.md, "Commits a
    crash may lose"): a crash of PostgreSQL may lose the last of them. Every PostgreSQL
    process gets SIGKILL at once (no shutdown, no checkpoint; the WAL writer dies with its
    unflushed records), PostgreSQL starts again through crash recovery, and every accepted
    export still succeeds exactly once. A request whose answer the crash cut off is retried
    with its Idempotency-Key, as a client does: it finds its job or makes one, never two."""
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    load = LoadGenerator(env, ctx.tenant, rate=15, threads=6, bulk_share=0.05, seed=26).start()
    try:
        wait_for(lambda: len(load.accepted) >= 40, 90, "40 accepted submits before the fault")
        pid = env.postgres_pid()
        if pid is None:
            raise RuntimeError("postmaster pid unknown")
        victims = _postgres_processes(pid)
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        killed_at = ev.note("SIGKILL sent to every PostgreSQL process", pids=len(victims))
        ctx.defer("postgresql running", env.ensure_pg)
        ev.fault = {"signal": "SIGKILL", "postmaster_pid": pid, "processes": len(victims)}
        wait_for(lambda: not any(_alive(v) for v in victims), 15, "every PostgreSQL process gone")
        wait_for(lambda: time.time() - killed_at >= 2, 10, "2 s of outage")
        env.servers.start_pg()
        up_at = ev.note("PostgreSQL started (crash recovery)", postmaster_pid=env.postgres_pid())
        _wait_accepted_after(load, up_at, 20, 90)
    finally:
        load.stop()
    recovered = env.pg_log_lines("database system was not properly shut down")
    ev.check("PostgreSQL went through crash recovery", bool(recovered), recovered[:2])
    retried = _retry_unanswered(ctx, load)
    ev.observe("answers", load.outcome_counts())
    ev.observe("retried_after_the_crash", retried)
    by_key = load.jobs_for_keys()
    accepted = {a.key: a.job_id for a in load.accepted}
    ev.check(
        "every 202 names a committed job (nothing accepted was lost in the crash)",
        all(by_key.get(k) == j for k, j in accepted.items()),
        f"{len(accepted)} accepted",
    )
    ev.check(
        "every request that got no 202 made exactly its own job once retried with its key",
        all(by_key.get(k) == j for k, j in retried.items() if j),
        f"{len(retried)} retried",
    )
    jobs = sorted(set(by_key.values()))
    for j in jobs:
        ev.track(j, "submitted around the crash")
    _all_succeeded(ctx, jobs, s.lease_recovery_budget + s.dispatch_recovery_budget(99) + 120)
    rows = env.db.sql(
        "SELECT job_id, count(*) AS n FROM export_job_events"
        " WHERE kind = 'succeeded' AND job_id = ANY(%s::uuid[]) GROUP BY job_id",
        (jobs,),
    )
    ev.check(
        "each export succeeded exactly once (one succeeded event, one result)",
        len(rows) == len(jobs) and all(r["n"] == 1 for r in rows),
        f"{len(jobs)} jobs, {sum(r['n'] for r in rows)} succeeded events",
    )
    again = env.db.sql(
        "SELECT count(*) AS n FROM export_jobs WHERE id = ANY(%s::uuid[])"
        " AND (attempts > 1 OR dispatch_count > 1)",
        (jobs,),
    )[0]["n"]
    ev.observe("jobs_claimed_or_sent_again_after_the_crash", again)
    ev.recovery_seconds["outage_seconds"] = round(up_at - killed_at, 3)


def _postgres_processes(postmaster: int) -> list[int]:
    """The postmaster and every process it started (backends, WAL writer, checkpointer)."""
    import psutil

    root = psutil.Process(postmaster)
    return [postmaster, *(c.pid for c in root.children(recursive=True))]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _retry_unanswered(ctx: DrillContext, load: LoadGenerator) -> dict[str, str | None]:
    """Send every request that got no 202 again with its own Idempotency-Key (what a
    client does when an answer is an error or never came): ``{key: job id or None}``."""
    out: dict[str, str | None] = {}
    with ctx.tenant.api.http(timeout=30) as client:
        for a in load.refused:
            r = ctx.tenant.api.submit(a.body, key=a.key, client=client)
            out[a.key] = str(r.json()["id"]) if r.status_code == 202 else None
    return out


def _broker_loss(ctx: DrillContext, how: str) -> None:
    """Redis loses every message it holds (``restart``: shutdown without saving, then start;
    ``flush``: FLUSHDB) while clients submit and workers export."""
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    procs = processes(ctx)
    load = LoadGenerator(env, ctx.tenant, rate=6, threads=3, bulk_share=0.2, seed=11).start()
    backlog: list[str] = []
    fault_ready = False
    try:
        wait_for(lambda: len(load.accepted) >= 10, 60, "10 accepted submits before the fault")
        # A backlog on the bulk queue, held in Redis by pausing the bulk worker a moment
        # (positioning: the fault is what happens to Redis next; the worker resumes at once).
        bulk = env.proc("bulk-worker")
        bulk.signal(signal.SIGSTOP, group=True)
        paused_at = ev.note("bulk-worker paused to hold a backlog in Redis", pid=bulk.pid)
        ctx.defer("bulk-worker resumed", lambda: bulk.signal(signal.SIGCONT, group=True))
        try:
            backlog = [
                ctx.submit(ctx.bulk(fmt), role="bulk backlog")
                for fmt in ("json", "ndjson", "markdown_zip", "json", "ndjson", "markdown_zip")
            ]
            wait_for(
                lambda: len(env.queued_messages("exports.bulk")) >= 3,
                30,
                "the backlog's messages waiting in Redis",
            )
            fault_ready = True
        finally:
            if not fault_ready:
                bulk.signal(signal.SIGCONT, group=True)
        if how == "restart":
            snapshot = {q: env.queued_messages(q) for q in QUEUES}
            pid = env.redis_pid()
            env.servers.stop_redis()
            fault_at = ev.note("Redis shut down without saving", pid=pid)
            bulk.signal(signal.SIGCONT, group=True)
            ev.note("bulk-worker resumed", paused_seconds=round(time.time() - paused_at, 3))
            ctx.defer("redis running", env.ensure_redis)
            ev.fault = {"kind": "Redis restarted (shutdown nosave, start)", "pid": pid}
            wait_for(
                lambda: (
                    time.time() - fault_at >= 3
                    and sum(a.sent_at > fault_at for a in load.attempts) >= 10
                ),
                60,
                "3 s of broker outage under load",
            )
            env.servers.start_redis()
            back_at = ev.note("Redis started", pid=env.redis_pid())
        else:
            pipe = env.redis().pipeline(transaction=True)
            for q in QUEUES:
                pipe.lrange(q, 0, -1)
            pipe.flushdb()
            *lists, _ = pipe.execute()
            fault_at = back_at = ev.note("Redis flushed (FLUSHDB, atomically with a snapshot)")
            bulk.signal(signal.SIGCONT, group=True)
            ev.note("bulk-worker resumed", paused_seconds=round(time.time() - paused_at, 3))
            snapshot = {
                q: [parse_message(r, q) for r in raw] for q, raw in zip(QUEUES, lists, strict=True)
            }
            ev.fault = {"kind": "Redis FLUSHDB"}
        _wait_accepted_after(load, back_at, 10, 90)
    finally:
        load.stop()
    # one entry per job a message names: a batch message's every job, not only its first
    vanished = [
        {"id": m["id"], "job_id": job_id}
        for msgs in snapshot.values()
        for m in msgs
        if m["id"]
        for job_id in m["job_ids"]
    ]
    ev.observe("messages_in_redis_at_the_fault", [(m["id"], m["job_id"]) for m in vanished])
    accepted = [a.job_id for a in load.accepted if a.job_id]
    for j in accepted:
        ev.track(j, "accepted under load")
    budget = s.lease_recovery_budget + s.dispatch_recovery_budget(99)
    _all_succeeded(ctx, [*accepted, *backlog], finish_budget(budget) + 120)
    lost: list[dict[str, Any]] = []
    for m in vanished:
        history = env.db.history(m["job_id"])
        if any(str(e["message_id"]) == m["id"] for e in claim_events(history)):
            continue  # a worker had taken it just before the fault
        sent = next(
            (e for e in history if e["kind"] == "dispatched" and str(e["message_id"]) == m["id"]),
            None,
        )
        # the re-dispatch after the fault; or one made just before it whose event was still
        # pending in the outbox (held by a cap or the broker window), so it outlived the
        # flush and was sent after it
        sent_after = {
            str(e["message_id"])
            for e in history
            if e["kind"] == "dispatched" and e["at"].timestamp() > fault_at
        }
        red = next(
            (
                e
                for e in history
                if e["kind"] == "redispatched"
                and (e["at"].timestamp() > fault_at or str(e["message_id"]) in sent_after)
            ),
            None,
        )
        done = env.db.job(m["job_id"])
        count = int((red or {}).get("detail", {}).get("dispatch_count", 1) or 1)
        lost.append(
            {
                "job_id": m["job_id"],
                "message_id": m["id"],
                "redispatched": bool(red),
                "redispatch_pending_at_the_fault": (
                    red["at"].timestamp() <= fault_at if red else False
                ),
                "dispatch_count_at_redispatch": count,
                "sent_to_redispatched": seconds_between(
                    sent["at"] if sent else None, red["at"] if red else None
                ),
                "budget": round(s.dispatch_recovery_budget(count), 3),
                "sent_to_succeeded": seconds_between(
                    sent["at"] if sent else None, done["finished_at"]
                ),
                "history": kinds(history),
            }
        )
    ev.observe("vanished_messages", lost)
    ev.check(
        "messages vanished with Redis", bool(lost), f"{len(lost)} of {len(vanished)} never claimed"
    )
    late = [x for x in lost if not x["redispatched"]]
    ev.check("the scanner re-dispatched every job whose message vanished", not late, late[:3])
    over = [
        x
        for x in lost
        if x["sent_to_redispatched"] is None or x["sent_to_redispatched"] > x["budget"]
    ]
    ev.check(
        "each re-dispatch came within its dispatch threshold + scan interval",
        not over,
        over[:3] if over else [f"{x['sent_to_redispatched']} <= {x['budget']}" for x in lost],
    )
    if lost:
        ev.recovery_seconds["worst_sent_to_redispatched"] = max(
            x["sent_to_redispatched"] or 0 for x in lost
        )
        ev.recovery_seconds["worst_sent_to_succeeded"] = max(
            x["sent_to_succeeded"] or 0 for x in lost
        )
    check_answers(ev, env, ctx.tenant, load.attempts, set())
    check_not_restarted(ctx, procs)


@drill(
    "redis_restart_under_load",
    title="Redis restarted (its messages lost) while clients submit and workers export",
    group="infra",
    ci=False,  # make drills only: the CI budget (a similar drill runs in CI)
)
def redis_restart_under_load(ctx: DrillContext) -> None:
    _broker_loss(ctx, "restart")


@drill(
    "redis_flush_under_load",
    title="Redis flushed while clients submit and workers export",
    group="infra",
    ci=True,
)
def redis_flush_under_load(ctx: DrillContext) -> None:
    _broker_loss(ctx, "flush")


@drill(
    "redis_killed_mid_export",
    title="Redis SIGKILLed while a worker holds an unacknowledged message, back after 3 s",
    group="infra",
    ci=True,
)
def redis_killed_mid_export(ctx: DrillContext) -> None:
    env, ev = ctx.env, ctx.ev
    procs = processes(ctx)
    stall = 2.0
    env.arm("render.chunk", f"sleep:{stall}", 1)
    job = ctx.submit(ctx.small(3), role="running (its message unacknowledged) when Redis dies")
    env.wait_hits("render.chunk", 1, 30)
    since = {n: env.log_offset(n) for n in ("fast-worker", "bulk-worker")}
    pid = env.redis_pid()
    if pid is None:
        raise RuntimeError("redis pid unknown")
    os.kill(pid, signal.SIGKILL)
    killed_at = ev.note("SIGKILL sent to redis-server", pid=pid)
    ctx.defer("redis running", env.ensure_redis)
    ev.fault = {"signal": "SIGKILL", "pid": pid, "of": "redis-server", "down_seconds": 3}
    for name in since:
        env.wait_log(name, "Connection to broker lost", since[name], 15)
    ev.note("both workers noticed the lost broker connection")
    wait_for(lambda: time.time() - killed_at >= 3, 10, "3 s of broker outage")
    since = {n: env.log_offset(n) for n in since}
    env.servers.start_redis()
    up_at = ev.note("redis started (empty)", pid=env.redis_pid())
    for name in since:
        line = env.wait_log(name, "Connected to redis", since[name], 60)
        ev.observe(f"{name}_reconnected", line[:200])
    row = env.db.wait_terminal(job, 60)
    ev.check_eq("the export running through the outage succeeded", row["status"], "succeeded")
    probe = ctx.submit(ctx.small(1), role="probe after the outage")
    probe_row = env.db.wait_terminal(probe, 60)
    ev.check_eq("a new export is consumed again", probe_row["status"], "succeeded")
    ev.recovery_seconds["redis_up_to_probe_succeeded"] = seconds_between(
        up_at, probe_row["finished_at"]
    )
    check_not_restarted(ctx, procs)
    ev.recovery_seconds["outage_seconds"] = round(up_at - killed_at, 3)


def _storage_failure(ctx: DrillContext, mode: str) -> None:
    """The artifact filesystem refuses writes (``ro``: read-only, ``full``: no space left):
    one export runs out of attempts (dead letter), one succeeds once storage is back."""
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    used = env.artifact_usage_kib()
    if mode == "ro":
        env.remount_artifacts("ro")
        ev.fault = {"kind": "artifact tmpfs remounted read-only", "errno": "EROFS"}
    else:
        env.remount_artifacts(f"size={used}k")
        ev.fault = {
            "kind": "artifact tmpfs shrunk to its usage",
            "errno": "ENOSPC",
            "size_kib": used,
        }
    fault_at = ev.note("storage failing", mode=mode, used_kib=used)
    ctx.defer("artifact storage writable", env.restore_storage)
    doomed = ctx.submit(ctx.small(3), role="runs while storage fails until no attempt is left")
    row = env.db.wait_terminal(doomed, s.max_attempts * (s.retry_cap_seconds + 10) + 30)
    history = env.db.history(doomed)
    retried = [e for e in history if e["kind"] == "retried"]
    ev.check_eq("the export failed once its attempts were used up", row["status"], "failed")
    ev.check(
        "each failed attempt was a transient storage error, retried with a backoff",
        len(retried) == s.max_attempts - 1
        and all(e["detail"].get("error_code") == "storage_io_error" for e in retried),
        [e["detail"] for e in retried],
    )
    ev.check(
        "the dead letter says why",
        row["error_code"] == "attempts_exhausted"
        and "storage_io_error" in (row["error_detail"] or ""),
        f"{row['error_code']}: {row['error_detail']}",
    )
    left = env.artifacts_of(row["tenant_id"], doomed)
    ev.check("no file (not even a partial temp file) was left for it", not left, left)
    healed = ctx.submit(ctx.small(3), role="retried until storage came back")
    first = env.db.wait_event(healed, "retried", 60)[0]
    env.restore_storage()
    back_at = ev.note("storage writable again", first_error=first["detail"])
    done = env.db.wait_terminal(healed, 60)
    ev.check_eq("the second export succeeded once storage was back", done["status"], "succeeded")
    ev.check(
        "it succeeded on a later attempt after a storage error",
        done["attempts"] >= 2 and first["detail"].get("error_code") == "storage_io_error",
        f"attempts {done['attempts']}, first error {first['detail']}",
    )
    ev.recovery_seconds["storage_back_to_succeeded"] = seconds_between(back_at, done["finished_at"])
    ev.recovery_seconds["fault_seconds"] = round(back_at - fault_at, 3)


@drill(
    "artifact_store_read_only",
    title="the artifact filesystem turns read-only",
    group="infra",
    ci=True,
    needs_artifact_mount=True,
)
def artifact_store_read_only(ctx: DrillContext) -> None:
    _storage_failure(ctx, "ro")


@drill(
    "artifact_store_full",
    title="the artifact filesystem is full (ENOSPC)",
    group="infra",
    ci=True,
    needs_artifact_mount=True,
)
def artifact_store_full(ctx: DrillContext) -> None:
    _storage_failure(ctx, "full")
