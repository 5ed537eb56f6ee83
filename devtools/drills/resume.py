"""Resumable bulk exports under SIGKILL: the bulk worker's child is killed in the middle of a
render (stalled at the N-th chunk by a failpoint, then SIGKILLed by PID), and the next claim
takes over the checkpoint instead of rendering everything again (docs/architecture.md
"Checkpoints").

Each killed attempt's rendered notes are exact: the failpoint stalls the child before the
N-th chunk, and the renewal thread keeps recording the notes rendered so far (``renewed``
events' ``progress``) until the kill. A takeover's ``resumed`` event says how many notes it
carried over, so the notes rendered in all attempts together are known exactly.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from typing import Any

from devtools.drills.checks import kinds
from devtools.drills.harness import pid_alive, wait_for
from devtools.drills.registry import DrillContext, drill
from devtools.render_check import reference_sha256
from exportcore.db import make_pool
from exportcore.domain import ExportFormat, ExportRequest
from exportcore.submit import submit_export

BIG_NOTES = 200_000
"""Notes of the large export (the issue's figure)."""
NOTE_TEXT = 900
"""Characters of each large-export note (copies of the real notes, cut): ~200 MB of ndjson."""


def _kill_at(ctx: DrillContext, job: str, timeout: float) -> dict[str, Any]:
    """Once the job's render stalls at the armed chunk, wait until a renewal records its
    progress and SIGKILL the bulk worker's child; returns what the killed attempt did."""
    env, ev = ctx.env, ctx.ev
    [hit] = env.wait_hits("render.chunk", 1, timeout)
    token = env.db.job(job)["lease_token"]
    progressed = wait_for(
        lambda: [
            e
            for e in env.db.history(job)
            if e["kind"] == "renewed"
            and e["lease_token"] == token
            and e["at"].timestamp() > hit["at"]
        ],
        3 * ctx.settings.lease_seconds + 10,
        "a renewal that records the stalled attempt's progress",
    )
    rendered = int(progressed[-1]["detail"]["progress"])
    env.signal_child("bulk-worker", hit["pid"], signal.SIGKILL)
    killed_at = ev.note("SIGKILL sent to the bulk worker's child", pid=hit["pid"], notes=rendered)
    wait_for(lambda: not pid_alive(hit["pid"]), 10, f"child {hit['pid']} to die")
    env.disarm()
    ckpt = env.db.one("SELECT rows, bytes FROM export_checkpoints WHERE job_id = %s", (job,))
    return {
        "pid": hit["pid"],
        "lease_token": str(token),
        "progress_at_kill": rendered,
        "checkpoint_notes": ckpt["rows"],
        "checkpoint_bytes": ckpt["bytes"],
        "killed_at": killed_at,
    }


def _resume_scenario(
    ctx: DrillContext,
    total: int,
    fractions: list[float],
    bound: float,
    timeout: float,
    submit: Callable[[], str] | None = None,
) -> None:
    """Submit a bulk export of the tenant's ``total`` notes, kill its render at each
    fraction of them, let it finish, and check the result and the notes rendered in all
    attempts together (at most ``bound`` x the export's notes; 0: only the exact accounting
    is checked). The first stall is armed before the submit (a small export renders in a
    blink), for any job: the drill's export is the only one running. ``submit`` submits it
    (default: through the API)."""
    env, ev = ctx.env, ctx.ev
    chunk = ctx.settings.render_chunk_size
    skip = max(1, math.ceil(fractions[0] * total / chunk))
    env.arm("render.chunk", "sleep:600", 1, skip=skip)
    ev.fault = {"failpoint": "render.chunk", "fault": "sleep, then SIGKILL", "at": fractions}
    job = submit() if submit is not None else ctx.submit(ctx.bulk("ndjson"))
    ev.observe("notes", total)
    kills: list[dict[str, Any]] = []
    carried_in = 0
    for n, fraction in enumerate(fractions):
        if n:
            skip = max(1, math.ceil((fraction * total - carried_in) / chunk))
            env.arm("render.chunk", "sleep:600", 1, only=job, skip=skip)
        kill = _kill_at(ctx, job, timeout)
        kill["fraction"] = fraction
        kill["carried_in"] = carried_in
        kill["rendered"] = kill["progress_at_kill"] - carried_in
        kills.append(kill)
        carried_in = kill["checkpoint_notes"]
    row = env.db.wait_terminal(job, timeout)
    ev.check_eq("the export succeeded after the kills", row["status"], "succeeded")
    history = env.db.history(job)
    resumed = [e for e in history if e["kind"] == "resumed"]
    ev.check_eq(
        "each kill was followed by a takeover of the checkpoint (resumed events)",
        [e["detail"]["notes"] for e in resumed],
        [k["checkpoint_notes"] for k in kills],
    )
    ev.check(
        "every takeover carried notes over (the kill came after a checkpoint)",
        all(k["checkpoint_notes"] > 0 for k in kills),
        kills,
    )
    final = total - carried_in
    rendered = sum(k["rendered"] for k in kills) + final
    ratio = rendered / total
    ev.observe("takeover_seconds", [e["detail"].get("seconds") for e in resumed])
    ev.observe("kills", kills)
    ev.observe("rendered_notes", {"attempts": [k["rendered"] for k in kills] + [final]})
    ev.observe("rendered_over_notes", round(ratio, 4))
    if bound:
        ev.check_le(
            f"notes rendered in all attempts together <= {bound} x the export's", ratio, bound
        )
    started = time.monotonic()
    expected = reference_sha256(env.database_url, job)
    ev.observe("reference_render_seconds", round(time.monotonic() - started, 3))
    ev.check_eq(
        "byte-identical to an uninterrupted render of the snapshot (SHA-256)",
        row["result_sha256"],
        expected,
    )
    stored = env.artifacts_of(row["tenant_id"], job)
    ev.check(
        "the store holds the result and nothing of the killed attempts",
        [e["key"] for e in stored] == [row["result_ref"]]
        and all(e.get("sha256") == row["result_sha256"] for e in stored),
        stored,
    )
    ev.check_eq(
        "the checkpoint is gone with the success",
        env.db.one("SELECT count(*) AS n FROM export_checkpoints WHERE job_id = %s", (job,))["n"],
        0,
    )
    ev.observe("history", kinds(history))


@drill(
    "bulk_resume_after_sigkill",
    title="SIGKILL of the bulk worker in the middle of a render: the next claim resumes",
    group="process",
    ci=True,
)
def bulk_resume_after_sigkill(ctx: DrillContext) -> None:
    _resume_scenario(ctx, len(ctx.tenant.note_ids), [0.6], bound=0.0, timeout=90)


@drill(
    "bulk_resume_200k",
    title="a 200,000-note export, SIGKILLed at ~30 % and ~80 %, resumes each time",
    group="process",
    s3=True,
)
def bulk_resume_200k(ctx: DrillContext) -> None:
    env, ev = ctx.env, ctx.ev
    tenant = ctx.tenant
    copies = math.ceil(BIG_NOTES / max(1, len(tenant.note_ids)))
    started = time.monotonic()
    env.db.sql(
        "INSERT INTO notes (tenant_id, source_path, title, content, pinned, updated_at)"
        " SELECT n.tenant_id, n.source_path || '#copy-' || g, n.title || ' ' || g,"
        "        left(n.content, %s), n.pinned, n.updated_at"
        " FROM notes n CROSS JOIN generate_series(1, %s) AS g"
        " WHERE n.tenant_id = %s ORDER BY g, n.id LIMIT %s",
        (NOTE_TEXT, copies, tenant.id, BIG_NOTES - len(tenant.note_ids)),
    )
    ev.observe("seed_seconds", round(time.monotonic() - started, 3))
    ev.observe("artifact_backend", env.backend)
    # One attempt of a 200,000-note render (with a takeover through moto's S3 on a loaded
    # machine) can outlast the drill stack's TASK_TIME_LIMIT, whose kill would be one more
    # lease loss than the two this drill accounts for: the bulk worker gets a limit that
    # fits, for this drill only.
    env.restart_with("bulk-worker", TASK_TIME_LIMIT="1800", BROKER_VISIBILITY_TIMEOUT="1900")
    ctx.defer("bulk-worker with the stack's settings", lambda: env.restore_env("bulk-worker"))
    total = env.db.one("SELECT count(*) AS n FROM notes WHERE tenant_id = %s", (tenant.id,))["n"]
    _resume_scenario(
        ctx, total, [0.3, 0.8], bound=1.1, timeout=1800, submit=lambda: _submit_all(ctx)
    )


def _submit_all(ctx: DrillContext) -> str:
    """Submit an ndjson export of every note of the drill's tenant through the library path
    the api uses, without the api's statement timeout (copying a 200,000-note snapshot in
    one statement takes longer than ``DB_STATEMENT_TIMEOUT_MS``)."""
    settings = ctx.env.core_settings().model_copy(update={"db_statement_timeout_ms": 0})
    pool = make_pool(settings, "drills-submit", min_size=1, max_size=1)
    try:
        request = ExportRequest.build(ExportFormat.NDJSON, None, True)
        started = time.monotonic()
        job = submit_export(
            pool, settings, tenant_id=ctx.tenant.id, request=request, source="drill"
        ).job
        ctx.ev.observe("submit_seconds", round(time.monotonic() - started, 3))
    finally:
        pool.close()
    job_id = str(job["id"])
    ctx.ev.track(job_id, "job")
    return job_id
