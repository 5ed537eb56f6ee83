"""Observations and checks shared by several drills."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from devtools.drills.evidence import seconds_between
from devtools.drills.registry import DrillContext


def table_counts(ctx: DrillContext) -> dict[str, int]:
    """Rows of every table a submit writes, in the whole database."""
    return {
        table: int(ctx.env.db.scalar(f"SELECT count(*) FROM {table}"))
        for table in (
            "export_jobs",
            "export_outbox",
            "export_job_events",
            "export_job_items",
            "export_idempotency_keys",
        )
    }


def processes(ctx: DrillContext) -> dict[str, tuple[int, int, bool]]:
    """(pid, restarts, alive) of every process: proof that nothing was restarted for us."""
    return {n: (p.pid, p.restarts, p.alive) for n, p in ctx.env.procs.items()}


def check_not_restarted(ctx: DrillContext, before: dict[str, tuple[int, int, bool]]) -> None:
    """Every process is the one that ran before the fault and is still alive: whatever
    reconnected did so by itself."""
    after = processes(ctx)
    changed = {n: (before[n], after[n]) for n in before if after[n][:2] != before[n][:2]}
    dead = [n for n in after if not after[n][2]]
    ctx.ev.check(
        "every process recovered by itself: none restarted, all alive",
        not changed and not dead,
        f"restarted: {changed}, dead: {dead}" if changed or dead else f"pids {after}",
    )


def claim_events(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``claimed`` events of a history."""
    return [e for e in history if e["kind"] == "claimed"]


def kinds(history: list[dict[str, Any]]) -> list[str]:
    """The kinds of a history's events."""
    return [e["kind"] for e in history]


def finish_budget(budget: float) -> float:
    """Time to a finished job after a recovery budget: docs/architecture.md allows 60 s after a 45 s
    claimable-again budget (and 90 s after 65 s); the same third, at least 5 s, here."""
    return budget + max(5.0, budget / 3)


def refusal_summary(ctx: DrillContext, job: str) -> list[dict[str, Any]]:
    """The claim refusals the workers logged for ``job`` (duplicate deliveries seen)."""
    return [
        {"reason": r.get("reason"), "message_id": r.get("message_id"), "ts": r.get("ts")}
        for r in ctx.env.logs.refusals(job)
    ]


def stopped_unpublished(ctx: DrillContext, job: str, token: str) -> list[dict[str, Any]]:
    """The workers' log records of ``job`` saying that the holder of lease ``token`` found
    it lost and stopped without publishing (``why``: at which step, e.g. ``finish refused``
    when its finish CAS found another token)."""
    ctx.env.logs.refresh()
    return [
        r
        for r in ctx.env.logs.for_job(job)
        if r.get("message") == "lease lost; stopped without publishing"
        and r.get("lease_token") == token
    ]


def lease_recovery(ctx: DrillContext, job: str, died_at: float, label: str) -> dict[str, Any]:
    """After a worker died (or stopped) at ``died_at`` holding ``job``'s lease: wait for the
    job to finish and check the lease-recovery budget from its observed history."""
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    row = env.db.wait_terminal(job, finish_budget(s.lease_recovery_budget) + 60)
    history = env.db.history(job)
    claims = claim_events(history)
    expired = [e for e in history if e["kind"] == "lease_expired"]
    ev.check_eq(f"{label}: the job succeeded", row["status"], "succeeded")
    ev.check(
        f"{label}: recovered through its lease (lease_expired, a second claim, a new token)",
        bool(expired) and len(claims) == 2 and claims[0]["lease_token"] != claims[1]["lease_token"],
        f"history {kinds(history)}",
    )
    ev.duplicate_deliveries = {
        "claim_refusals": refusal_summary(ctx, job),
        "dispatch_count": row["dispatch_count"],
    }
    if not expired or len(claims) < 2:
        return row
    due = expired[0]["detail"].get("next_attempt_at")
    claimable = max(
        expired[0]["at"].timestamp(),
        datetime.fromisoformat(due).timestamp() if due else 0.0,
    )
    rec = ev.recovery_seconds
    rec["death_to_claimable"] = round(claimable - died_at, 3)
    rec["death_to_claimed_again"] = seconds_between(died_at, claims[1]["at"])
    rec["death_to_succeeded"] = seconds_between(died_at, row["finished_at"])
    ev.check_le(
        f"{label}: claimable again within lease + scan interval + backoff cap",
        rec["death_to_claimable"],
        s.lease_recovery_budget,
    )
    ev.check_le(
        f"{label}: finished within the finish budget",
        rec["death_to_succeeded"],
        finish_budget(s.lease_recovery_budget),
    )
    ev.check_eq(f"{label}: attempts counted both claims", row["attempts"], 2)
    return row


def redispatch_checks(ctx: DrillContext, job: str, lost_at: float) -> None:
    """A job whose message vanished: the scanner re-dispatches it after the threshold and it
    finishes; attempts untouched by the re-dispatch."""
    env, ev, s = ctx.env, ctx.ev, ctx.settings
    red = env.db.wait_event(job, "redispatched", s.dispatch_recovery_budget(1) + 30)[0]
    row = env.db.wait_terminal(job, finish_budget(s.dispatch_recovery_budget(1)) + 30)
    history = env.db.history(job)
    first = next(e for e in history if e["kind"] == "dispatched")
    claims = claim_events(history)
    rec = ev.recovery_seconds
    rec["dispatched_to_redispatched"] = seconds_between(first["at"], red["at"])
    rec["dispatched_to_claimed"] = seconds_between(first["at"], claims[0]["at"] if claims else None)
    rec["dispatched_to_succeeded"] = seconds_between(first["at"], row["finished_at"])
    rec["loss_to_succeeded"] = seconds_between(lost_at, row["finished_at"])
    ev.check_eq("the export succeeded", row["status"], "succeeded")
    ev.check(
        "re-dispatched no earlier than the dispatch threshold",
        (rec["dispatched_to_redispatched"] or 0) >= s.dispatch_threshold_seconds - 0.05,
        f"{rec['dispatched_to_redispatched']} s, threshold {s.dispatch_threshold_seconds} s",
    )
    ev.check_le(
        "re-dispatched within the dispatch threshold + scan interval",
        rec["dispatched_to_redispatched"],
        s.dispatch_recovery_budget(1),
    )
    ev.check_le(
        "finished within the finish budget of the lost-dispatch path",
        rec["dispatched_to_succeeded"],
        finish_budget(s.dispatch_recovery_budget(1)),
    )
    ev.check(
        "a new message id, dispatch count 2, one attempt (a re-dispatch is not an attempt)",
        red["message_id"] != first["message_id"]
        and row["dispatch_count"] == 2
        and row["attempts"] == 1
        and len(claims) == 1,
        f"messages {first['message_id']} -> {red['message_id']}, "
        f"dispatches {row['dispatch_count']}, attempts {row['attempts']}",
    )
    ev.duplicate_deliveries = {
        "dispatch_count": row["dispatch_count"],
        "claim_refusals": refusal_summary(ctx, job),
    }
