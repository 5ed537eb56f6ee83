"""Failover drills on the high-availability topology (``topology="ha"``): Patroni switches
the PostgreSQL primary over or promotes the synchronous standby after the primary's
machine died, and Redis Sentinel promotes the replica after the master died, while clients
submit. What must hold: every 202 ends ``succeeded`` exactly once, nothing accepted is
lost, the api answers a request that meets the failover with a 503 problem and
Retry-After (never a 500), every process recovers by itself; each drill records how long
clients saw no 202 (the unavailable window) and how long the first dispatch took after it.

The engines decide everything: ``patronictl switchover``, a SIGKILL of the primary's
Patroni and PostgreSQL together (the PgBouncer in front of the primary is repointed by
Patroni's ``on_role_change`` callback, not killed), a SIGKILL of the primary's PostgreSQL
alone (its Patroni releases the leader key at once: ``primary_start_timeout`` 0), a SIGKILL
of the Redis master. Each PostgreSQL failover checks its unavailable window against the
bound Patroni's timing gives (:meth:`DrillSettings.failover_unavailable_budget`).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from collections.abc import Sequence
from typing import Any

from devtools.drills.checks import check_not_restarted, finish_budget, processes
from devtools.drills.config import FailoverKind
from devtools.drills.evidence import seconds_between
from devtools.drills.harness import wait_for
from devtools.drills.load import Attempt, LoadGenerator, Sampler, check_answers, readyz_status
from devtools.drills.registry import DrillContext, drill

# The promises of an unavailable primary: the only error a client may see.
UNAVAILABLE = {"503 database_unavailable"}
# From the new primary to the first dispatch: the publisher's next pass after its pool
# reconnects (a connect timeout and a poll interval, with room for a loaded machine).
FIRST_DISPATCH_BUDGET_SECONDS = 15.0
REDIS_DISPATCH_BUDGET_SECONDS = 30.0
_BACKGROUND = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="patronictl")


def unavailable_window(attempts: Sequence[Attempt], since: float) -> dict[str, Any]:
    """What clients saw from ``since`` on: the longest time between two consecutive 202
    answers (``longest_gap_seconds``, from the last 202 before it), the span of the
    answers that were not 202 (``errors_first`` to ``errors_last``) and their count."""
    accepted = sorted(a.done_at for a in attempts if a.status == 202)
    before = [t for t in accepted if t <= since]
    after = [t for t in accepted if t > since]
    points = ([before[-1]] if before else []) + after
    gaps = [(b - a, a, b) for a, b in itertools.pairwise(points)]
    gap, start, end = max(gaps, default=(0.0, since, since))
    errors = sorted(a.done_at for a in attempts if a.status != 202 and a.sent_at >= since - 1)
    return {
        "longest_gap_seconds": round(gap, 3),
        "gap_from": round(start, 3),
        "gap_to": round(end, 3),
        "errors": len(errors),
        "errors_span_seconds": round(errors[-1] - errors[0], 3) if errors else 0.0,
        "errors_first": round(errors[0], 3) if errors else None,
        "errors_last": round(errors[-1], 3) if errors else None,
    }


def first_dispatch_after(ctx: DrillContext, since: float, new_only: bool = False) -> float | None:
    """Unix time of the first ``dispatched`` event of the drill's tenant after ``since``
    (``new_only``: of an export submitted after ``since``)."""
    at = ctx.env.db.scalar(
        "SELECT min(e.at) FROM export_job_events e JOIN export_jobs j ON j.id = e.job_id"
        " WHERE j.tenant_id = %s AND e.kind = 'dispatched' AND e.at > to_timestamp(%s)"
        " AND (NOT %s OR j.created_at > to_timestamp(%s))",
        (ctx.tenant.id, since, new_only, since),
    )
    return at.timestamp() if at is not None else None


def dispatch_latencies(ctx: DrillContext, attempts: Sequence[Attempt], after: float) -> list[float]:
    """Submit → dispatch of the first five exports accepted after ``after`` (seconds): the
    publisher hears their NOTIFY again once its LISTEN is back."""
    first = sorted(
        (a for a in attempts if a.status == 202 and a.sent_at > after), key=lambda a: a.sent_at
    )
    out = []
    for a in first[:5]:
        rows = ctx.env.db.sql(
            "SELECT min(at) FILTER (WHERE kind = 'submitted') AS s,"
            " min(at) FILTER (WHERE kind = 'dispatched') AS d"
            " FROM export_job_events WHERE job_id = %s",
            (a.job_id,),
        )
        if rows and rows[0]["s"] and rows[0]["d"]:
            out.append(round((rows[0]["d"] - rows[0]["s"]).total_seconds(), 3))
    return out


def listening(ctx: DrillContext) -> bool:
    """True when the publisher's LISTEN session runs on the current primary."""
    return bool(
        ctx.env.db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name ="
            " 'exports-publisher-listen' AND query ILIKE 'LISTEN%%'"
        )
    )


def hourly_schedule(ctx: DrillContext) -> str:
    """A schedule of the drill's tenant whose first slot is an hour away (made due on
    purpose by :func:`schedule_slot_after`); deleted when the drill ends. Returns its id."""
    with ctx.tenant.api.http() as c:
        r = c.post(
            "/v1/schedules",
            json={
                "name": "failover",
                "interval_seconds": 3600,
                "note_ids": ctx.tenant.note_ids[:2],
                "format": "json",
                "catch_up": "skip",
            },
        )
    if r.status_code != 201:
        raise AssertionError(f"schedule create answered {r.status_code}: {r.text}")
    schedule_id = str(r.json()["id"])

    def delete() -> None:
        with ctx.tenant.api.http() as c:
            c.delete(f"/v1/schedules/{schedule_id}")

    ctx.defer("schedule deleted", delete)
    return schedule_id


def schedule_slot_after(ctx: DrillContext, schedule_id: str, since: float) -> float:
    """Make the schedule's slot due now (its cursor moved in the database, as the drills
    move timestamps) and wait until a tick of beat, run by a worker, records the slot:
    beat and the tick run against the new primary. Returns seconds from ``since``."""
    env = ctx.env
    env.db.one(
        "UPDATE export_schedules SET next_due_at = now() - interval '1 s' WHERE id = %s"
        " RETURNING id",
        (schedule_id,),
    )
    slot = wait_for(
        lambda: env.db.sql(
            "SELECT created_at, job_id FROM export_schedule_slots WHERE schedule_id = %s",
            (schedule_id,),
        ),
        60,
        "beat's tick to record the due schedule slot",
    )[0]
    if slot["job_id"]:
        ctx.ev.track(slot["job_id"], "schedule slot after the failover")
    return round(time.time() - since, 3)


def settle_all(ctx: DrillContext, load: LoadGenerator, timeout: float) -> list[str]:
    """Wait for every accepted export (and every export committed for a request whose
    answer was lost) to end; check each succeeded exactly once. Returns their ids."""
    env, ev = ctx.env, ctx.ev
    accepted = sorted({a.job_id for a in load.accepted if a.job_id})
    by_key = env.jobs_for_keys(ctx.tenant.id, [a.key for a in load.attempts])
    committed = sorted(set(accepted) | set(by_key.values()))
    for j in committed:
        ev.track(j, "accepted under load" if j in accepted else "committed, answer lost")
    deadline = time.monotonic() + timeout
    for j in committed:
        env.db.wait_terminal(j, max(1.0, deadline - time.monotonic()))
    rows = env.db.sql(
        "SELECT j.status, count(*) FILTER (WHERE e.kind = 'succeeded') AS wins"
        " FROM export_jobs j LEFT JOIN export_job_events e ON e.job_id = j.id"
        " WHERE j.id = ANY(%s::uuid[]) GROUP BY j.id, j.status",
        (committed,),
    )
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    duplicated = sum(r["wins"] > 1 for r in rows)
    lost = len(committed) - len(rows) + sum(r["status"] != "succeeded" for r in rows)
    ev.observe(
        "outcome",
        {
            "accepted": len(accepted),
            "committed_without_an_answer": len(set(by_key.values()) - set(accepted)),
            "statuses": statuses,
            "lost": lost,
            "duplicated": duplicated,
        },
    )
    ev.check_eq(
        "every export accepted (or committed) succeeded, nothing lost",
        statuses,
        {"succeeded": len(committed)},
    )
    ev.check_eq("no export succeeded twice", duplicated, 0)
    return committed


def _pg_failover(ctx: DrillContext, how: FailoverKind, *, rate: float, threads: int) -> None:
    """PostgreSQL's primary goes away (``how``: ``switchover``; ``crash``, its PostgreSQL
    killed; ``kill``, its Patroni and PostgreSQL killed: its machine died) while clients
    submit at ``rate`` per second."""
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    pg = env.ha.postgres
    procs = processes(ctx)
    before: dict[str, Any] = {
        "leader": pg.leader(),
        "sync_standby": pg.sync_standby(),
        "timeline": pg.timeline(),
    }
    ev.observe("patroni_before", before)
    # Clients retry a 503 with the same key after Retry-After for up to a minute, as a
    # careful client does: an export whose commit landed but whose answer was lost is then
    # answered 202 (Idempotent-Replayed) instead of staying unknown to its client.
    load = LoadGenerator(
        env, ctx.tenant, rate=rate, threads=threads, bulk_share=0.1, seed=28, retries=12
    ).start()
    ready = Sampler(lambda: readyz_status(env), 0.2).start()
    passes = env.scanner_passes()
    schedule = hourly_schedule(ctx)
    try:
        wait_for(lambda: len(load.accepted) >= 10, 60, "10 accepted submits before the fault")
        switchover: concurrent.futures.Future[str] | None = None
        if how == "switchover":
            fault_at = ev.note("patronictl switchover", leader=before["leader"])
            ev.fault = {"kind": "patronictl switchover", "from": before["leader"]}
            # patronictl answers once the switchover is done: the promotion is watched meanwhile
            switchover = _BACKGROUND.submit(pg.switchover)
        elif how == "crash":
            leader, pids = pg.crash_leader()
            fault_at = ev.note("SIGKILL of the primary's PostgreSQL (Patroni lives)", pids=pids)
            ev.fault = {"kind": "primary's PostgreSQL killed", "member": leader, "pids": pids}
            # its Patroni rejoins it as a replica (rewound) by itself
            ctx.defer("the crashed member rejoined as a replica", pg.wait_healthy)
        else:
            leader, pids = pg.kill_leader()
            fault_at = ev.note("SIGKILL of the primary's Patroni and PostgreSQL", pids=pids)
            ev.fault = {"kind": "primary killed", "member": leader, "pids": pids}
            ctx.defer("the killed member rejoined as a replica", env.ensure_servers)
        gone: list[float] = []  # when the old primary was first seen no longer leading

        def new_primary() -> str | None:
            name = pg.leader_or_none()
            if name != before["leader"] and not gone:
                gone.append(time.time())
            return name if name not in (None, before["leader"]) else None

        new_leader = wait_for(new_primary, 120, "Patroni to name a new primary", interval=0.05)
        promoted_at = ev.note("new primary running", leader=new_leader)
        ev.recovery_seconds["old_primary_gone_to_new_primary"] = seconds_between(
            gone[0], promoted_at
        )
        if switchover is not None:
            ev.note("patronictl switchover answered", to=switchover.result(timeout=120))
        wait_for(
            lambda: sum(a.sent_at > promoted_at for a in load.accepted) >= 10,
            120,
            "10 accepted submits after the new primary",
        )
        listen_at = wait_for(
            lambda: listening(ctx) and time.time(), 60, "the publisher's LISTEN on the new primary"
        )
    finally:
        load.stop()
        samples = ready.stop()
    after: dict[str, Any] = {"leader": pg.leader(), "timeline": pg.timeline()}
    ev.observe("patroni_after", after)
    window = unavailable_window(load.attempts, fault_at)
    ev.observe("unavailable_window", window)
    window_end = window["gap_to"] if window["longest_gap_seconds"] else promoted_at
    first = first_dispatch_after(ctx, max(promoted_at, window_end - 0.001))
    rec = ev.recovery_seconds
    rec["fault_to_new_primary"] = seconds_between(fault_at, promoted_at)  # patronictl included
    rec["unavailable_window"] = window["longest_gap_seconds"]
    rec["new_primary_to_first_dispatch"] = seconds_between(promoted_at, first)
    rec["window_end_to_first_dispatch"] = seconds_between(window_end, first)
    rec["new_primary_to_listen"] = seconds_between(promoted_at, listen_at)
    latencies = dispatch_latencies(ctx, load.attempts, window_end)
    ev.observe("submit_to_dispatch_after_the_window", latencies)
    ev.observe("readyz", sorted({str(v) for t, v in samples if t > fault_at}))
    ev.check(
        "Patroni promoted the synchronous standby (a commit that answered was on it)",
        after["leader"] == before["sync_standby"],
        f"{before} -> {after}",
    )
    ev.check(
        "the new primary runs on a new timeline",
        (after["timeline"] or 0) > (before["timeline"] or 0),
        f"timeline {before['timeline']} -> {after['timeline']}",
    )
    check_answers(ev, env, ctx.tenant, load.attempts, UNAVAILABLE)
    ev.check_le(
        f"clients got a 202 again within the {how}'s bound (Patroni's timing, then the"
        " promotion and the pools' reconnect)",
        rec["unavailable_window"],
        s.failover_unavailable_budget(how),
    )
    ev.check_le(
        "the publisher dispatched again soon after the new primary ran",
        rec["new_primary_to_first_dispatch"],
        FIRST_DISPATCH_BUDGET_SECONDS,
    )
    ev.check(
        "the publisher LISTENs on the new primary again (pg_stat_activity)",
        True,
        f"{rec['new_primary_to_listen']} s after the new primary; submit -> dispatch after"
        f" the window {latencies} s",
    )
    env.logs.refresh()
    unknown = env.logs.matching(
        "completion unknown: the database did not answer; the lease recovers the job"
    )
    ev.observe("unknown_completions", [(r.get("job_id"), r.get("step")) for r in unknown])
    wait_for(lambda: env.scanner_passes() >= passes + 3, 60, "scanner passes after the failover")
    ev.check("the recovery-scanner runs passes again", True, f"passes {passes} -> more")
    rec["new_primary_to_schedule_slot"] = schedule_slot_after(ctx, schedule, promoted_at)
    ev.check(
        "beat's tick ran against the new primary (a due schedule slot was recorded)",
        True,
        f"{rec['new_primary_to_schedule_slot']} s after the new primary",
    )
    settle_all(
        ctx, load, finish_budget(s.lease_recovery_budget + s.dispatch_recovery_budget(99)) + 120
    )
    check_not_restarted(ctx, procs)


@drill(
    "pg_switchover_under_load",
    title="patronictl switchover of the PostgreSQL primary while 5 exports/s arrive",
    group="failover",
    ci=True,
    topology="ha",
)
def pg_switchover_under_load(ctx: DrillContext) -> None:
    _pg_failover(ctx, "switchover", rate=5, threads=6)


@drill(
    "pg_primary_kill_under_load",
    title="SIGKILL of the PostgreSQL primary (Patroni promotes the synchronous standby) under load",
    group="failover",
    ci=True,
    topology="ha",
)
def pg_primary_kill_under_load(ctx: DrillContext) -> None:
    _pg_failover(ctx, "kill", rate=5, threads=6)


@drill(
    "pg_postgres_crash_under_load",
    title="SIGKILL of the primary's PostgreSQL, its Patroni alive: failover at once under load",
    group="failover",
    topology="ha",
)
def pg_postgres_crash_under_load(ctx: DrillContext) -> None:
    _pg_failover(ctx, "crash", rate=5, threads=6)


@drill(
    "pg_failover_during_submit_burst",
    title="the PostgreSQL primary killed during a burst of 30 submits/s from 16 clients",
    group="failover",
    topology="ha",
)
def pg_failover_during_submit_burst(ctx: DrillContext) -> None:
    _pg_failover(ctx, "kill", rate=30, threads=16)


@drill(
    "redis_master_kill_under_load",
    title="SIGKILL of the Redis master (Sentinel promotes the replica) while exports arrive",
    group="failover",
    topology="ha",
)
def redis_master_kill_under_load(ctx: DrillContext) -> None:
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    rd = env.ha.redis
    procs = processes(ctx)
    load = LoadGenerator(env, ctx.tenant, rate=5, threads=6, bulk_share=0.1, seed=29).start()
    try:
        wait_for(lambda: len(load.accepted) >= 10, 60, "10 accepted submits before the fault")
        old, pid = rd.kill_master()
        killed_at = ev.note("SIGKILL of the Redis master", node=old, pid=pid)
        ev.fault = {"kind": "Redis master killed", "node": old, "pid": pid}
        ctx.defer("the old master rejoined as a replica", env.ensure_servers)
        new, promoted_at = rd.wait_new_master(old, 60)
        ev.note("Sentinel promoted a new master", node=new)
        wait_for(
            lambda: first_dispatch_after(ctx, killed_at, new_only=True),
            REDIS_DISPATCH_BUDGET_SECONDS + 30,
            "a dispatch through the new master",
        )
        wait_for(
            lambda: sum(a.sent_at > promoted_at for a in load.accepted) >= 10,
            60,
            "10 accepted submits after the new master",
        )
    finally:
        load.stop()
    first = first_dispatch_after(ctx, killed_at, new_only=True)
    rec = ev.recovery_seconds
    rec["kill_to_new_master"] = seconds_between(killed_at, promoted_at)
    rec["kill_to_first_dispatch"] = seconds_between(killed_at, first)
    rec["new_master_to_first_dispatch"] = seconds_between(promoted_at, first)
    window = unavailable_window(load.attempts, killed_at)
    ev.observe("submits_during_the_failover", window)
    rec["unavailable_window"] = window["longest_gap_seconds"]
    check_answers(ev, env, ctx.tenant, load.attempts, set())
    ev.check_le(
        "dispatch resumed within 30 s of the kill (an export submitted after it)",
        rec["kill_to_first_dispatch"],
        REDIS_DISPATCH_BUDGET_SECONDS,
    )
    settle_all(
        ctx, load, finish_budget(s.lease_recovery_budget + s.dispatch_recovery_budget(99)) + 120
    )
    check_not_restarted(ctx, procs)
