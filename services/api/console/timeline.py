"""Why a job is where it is: its history as timeline steps, a one-paragraph explanation of
its current state, and error details made safe to show. Plain functions of rows (no I/O),
unit-tested in tests/unit/test_console_timeline.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from exportcore.db import Row
from exportcore.display import INVISIBLE_FORMAT_CLASS
from exportcore.redaction import redact

MAX_DETAIL_CHARS = 2000

# Control characters (but newline and tab) and the invisible formatting characters of
# exportcore.display, which exportctl prints escaped.
_CONTROL = re.compile(rf"[\x00-\x08\x0b-\x1f\x7f-\x9f{INVISIBLE_FORMAT_CLASS}]")


def sanitise_detail(text: str | None, limit: int = MAX_DETAIL_CHARS) -> str:
    """An error detail as the console shows it: secrets redacted (the rules of
    :mod:`exportcore.redaction`: API keys, URL credentials, ``password=…``-style pairs, AWS
    key ids, bearer tokens, PostgreSQL's row content), control and bidirectional
    formatting characters removed (except newline and tab), at most ``limit`` characters
    (then ``… (N more characters)``). HTML escaping is the template's job (autoescape)."""
    if not text:
        return ""
    out = redact(_CONTROL.sub("", text), mask="[redacted]")
    if len(out) > limit:
        out = f"{out[:limit]}… ({len(out) - limit} more characters)"
    return out


def seconds_between(a: datetime | None, b: datetime | None) -> float | None:
    """``b - a`` in seconds, or None when either is missing."""
    if a is None or b is None:
        return None
    return (b - a).total_seconds()


def human_duration(seconds: float | None) -> str:
    """``850 ms``, ``4.2 s``, ``3 min 5 s``, ``2 h 10 min``, ``3 d 4 h``; ``—`` for None.
    Negative values (a time in the future) are shown by their magnitude."""
    if seconds is None:
        return "—"
    s = abs(seconds)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    if s < 3600:
        m, rest = divmod(int(s), 60)
        return f"{m} min {rest} s" if rest else f"{m} min"
    if s < 86400:
        h, rest = divmod(int(s), 3600)
        return f"{h} h {rest // 60} min" if rest >= 60 else f"{h} h"
    d, rest = divmod(int(s), 86400)
    return f"{d} d {rest // 3600} h" if rest >= 3600 else f"{d} d"


def short(value: Any, n: int = 8) -> str:
    """An id for lists: a UUID as its first 8 and last 4 characters (``0190ab12…5e6f``).
    The ids are UUIDv7, whose first characters are the time they were made, so jobs of one
    second share them; the last are random and tell them apart. The search field takes this
    form back. Anything else: its first ``n`` characters."""
    if not value:
        return ""
    text = str(value)
    if len(text) == 36 and text.count("-") == 4 and n == 8:
        return f"{text[:8]}…{text[-4:]}"
    return text[:n]


@dataclass
class Step:
    """One row of a job's timeline.

    ``at`` is when it happened; ``gap`` the seconds since the previous step; ``title`` and
    ``text`` what happened in words; ``wait`` the seconds the job was told to wait after
    it (a retry's backoff); ``links`` job ids the step refers to (a replay);
    ``count`` how many events it stands for (lease renewals are folded into one step);
    ``tone`` one of ``ok``, ``bad``, ``warn``, ``info`` for styling (never the only signal).
    """

    kind: str
    at: datetime
    title: str
    text: str = ""
    gap: float | None = None
    wait: float | None = None
    wait_until: datetime | None = None
    count: int = 1
    last_at: datetime | None = None
    tone: str = "info"
    links: dict[str, Any] = field(default_factory=dict)


def _iso(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def _step(ev: Row, job: Row) -> Step:
    kind = ev["kind"]
    d: dict[str, Any] = ev.get("detail") or {}
    at = ev["at"]
    attempt = ev.get("attempt")
    of = f" of {job['max_attempts']}" if job.get("max_attempts") else ""
    if kind == "submitted":
        if d.get("replay_of"):
            return Step(
                kind,
                at,
                "Submitted as a replay",
                "a new job with the snapshot of the failed job it replays",
                links={"replay_of": d["replay_of"]},
            )
        source = d.get("source", "api")
        notes = d.get("note_count", job.get("note_count"))
        origin = f", from schedule {short(d['schedule_id'])}" if d.get("schedule_id") else ""
        return Step(kind, at, "Submitted", f"accepted from {source}{origin}; {notes} notes")
    if kind == "dispatched":
        return Step(
            kind,
            at,
            "Dispatched",
            f"message {short(ev.get('message_id'))} sent to the broker "
            f"({d.get('reason', 'submit')}, dispatch #{d.get('dispatch_count', '?')})",
        )
    if kind == "redispatched":
        return Step(
            kind,
            at,
            "Re-dispatched",
            "no worker took the last message in time: the recovery-scanner queued a new one "
            f"(attempts unchanged, dispatch #{d.get('dispatch_count', '?')})",
            tone="warn",
        )
    if kind == "claimed":
        return Step(
            kind,
            at,
            f"Claimed: attempt {attempt}{of}",
            f"a worker took the job with lease token {short(ev.get('lease_token'))}",
        )
    if kind == "renewed":
        progress = d.get("progress")
        done = f"; {progress} of {job.get('note_count')} notes rendered" if progress else ""
        return Step(
            kind,
            at,
            "Lease renewed",
            f"attempt {attempt}, lease until {d.get('lease_expires_at', '?')}{done}",
        )
    if kind in ("retried", "lease_expired"):
        until = _iso(d.get("next_attempt_at"))
        wait = seconds_between(at, until)
        code = d.get("error_code") or job.get("error_code") or ""
        if kind == "retried":
            title = f"Attempt {attempt} failed: retry"
            text = f"a transient error ({code}); the job waits out a backoff, then queues again"
        else:
            title = f"Lease expired (attempt {attempt})"
            text = (
                "the worker stopped renewing its lease (it died, stalled or lost the database); "
                "the recovery-scanner took the job back"
            )
            if to := ev.get("to_status"):
                text += f" ({to})" if to != "queued" else ", to be queued again"
        return Step(kind, at, title, text, wait=wait, wait_until=until, tone="warn")
    if kind == "succeeded":
        nbytes = d.get("bytes")
        return Step(
            kind,
            at,
            "Succeeded",
            f"published {d.get('rows', '?')} notes, {nbytes if nbytes is not None else '?'} bytes",
            tone="ok",
        )
    if kind == "failed":
        code = d.get("error_code") or job.get("error_code") or "unknown"
        detail = sanitise_detail(d.get("error_detail"), 300)
        return Step(kind, at, f"Failed: {code}", detail, tone="bad")
    if kind == "dead_lettered":
        return Step(
            kind, at, "Dead-lettered", "kept for an operator: replay it or mark it resolved"
        )
    if kind == "cancel_requested":
        by = {"tenant": " by the tenant", "operator": " by an operator"}.get(
            str(d.get("requested_by")), ""
        )
        bulk = f" (bulk action {d['bulk_id']})" if d.get("bulk_id") else ""
        if ev.get("from_status") == "queued":
            text = "the job was queued, so it was cancelled at once: no worker runs it"
        else:
            text = "the job was running: its worker stops at its next chunk boundary"
        return Step(kind, at, f"Cancel requested{by}{bulk}", text)
    if kind == "cancelled":
        return Step(kind, at, "Cancelled", tone="warn")
    if kind == "replayed":
        return Step(
            kind,
            at,
            "Replayed",
            "a new job was created from this one's snapshot",
            links={"replayed_by": d.get("replayed_by")},
        )
    return Step(kind, at, kind.replace("_", " ").capitalize(), sanitise_detail(str(d), 300))


ACTION_TITLES = {
    "replay": "Replay asked",
    "resolve": "Dead letter resolved",
    "cancel": "Cancel asked",
    "run_now": "Run now asked",
}


def _action_step(action: Row) -> Step:
    """An audit row of the job (``operator_actions``) as a step: who did what."""
    name = action["action"]
    title = ACTION_TITLES.get(name, name.replace("_", " ").capitalize())
    detail: dict[str, Any] = action.get("detail") or {}
    text = f"outcome: {action['outcome']}"
    if detail.get("note"):
        text += f"; note: {sanitise_detail(str(detail['note']), 200)}"
    if detail.get("replay_id"):
        text += f"; replay {short(detail['replay_id'])}"
    return Step(
        "audit",
        action["at"],
        f"{title} by {action['actor']}",
        text,
        links={"replayed_by": detail.get("replay_id")} if detail.get("replay_id") else {},
    )


def build_timeline(job: Row, events: list[Row], actions: list[Row] | None = None) -> list[Step]:
    """The job's history as steps, oldest first: one step per event, except that
    consecutive lease renewals become one step (``count``, ``last_at``, the latest text);
    with ``actions`` (its audit rows), a step per action too, right after the events of the
    same instant (an action and its event commit together). ``gap`` is measured from the
    previous step's last event."""
    steps: list[Step] = []
    previous: datetime | None = None
    merged = sorted(
        [(ev["at"], 0, i, ev) for i, ev in enumerate(events)]
        + [(a["at"], 1, i, a) for i, a in enumerate(actions or [])],
        key=lambda t: (t[0], t[1], t[2]),
    )
    for _, is_action, _, ev in merged:
        step = _action_step(ev) if is_action else _step(ev, job)
        if steps and step.kind == "renewed" and steps[-1].kind == "renewed":
            last = steps[-1]
            last.count += 1
            last.last_at = step.at
            last.text = step.text
            last.title = f"Lease renewed {last.count} times"
        else:
            step.gap = seconds_between(previous, step.at)
            steps.append(step)
        previous = ev["at"]
    return steps


def explain(job: Row, now: datetime, replay: Row | None = None) -> str:
    """One or two sentences on why the job is in its state and what happens next.

    ``replay`` is the newest replay of the job (``id``, ``status``), if any.
    """
    status = job["status"]
    attempt = f"attempt {job['attempts']} of {job['max_attempts']}"
    code = job.get("error_code")
    if status == "queued":
        due = job.get("next_attempt_at")
        if job.get("cancel_requested"):
            return "Cancel requested; the recovery-scanner cancels it on its next pass."
        if due is not None and due > now:
            return (
                f"Waiting out a retry backoff after {attempt} failed"
                f"{f' with {code}' if code else ''}; it is due again in "
                f"{human_duration(seconds_between(now, due))}."
            )
        dispatched = job.get("last_dispatched_at")
        sent = (
            f"its message was last sent {human_duration(seconds_between(dispatched, now))} ago"
            if dispatched
            else "its first message has not been published yet"
        )
        return f"Queued on {job['queue']}, waiting for a worker; {sent}."
    if status == "running":
        lease = job.get("lease_expires_at")
        progress = job.get("progress")
        done = f"; {progress} of {job['note_count']} notes rendered" if progress else ""
        if job.get("cancel_requested"):
            return (
                "Cancel requested; the worker stops at its next chunk boundary and the job "
                "becomes cancelled."
            )
        if lease is not None and lease <= now:
            return (
                f"The lease of {attempt} expired {human_duration(seconds_between(lease, now))} "
                "ago: the worker stopped renewing it. The recovery-scanner will queue it again "
                "(or fail it when no attempt or time is left)."
            )
        return (
            f"Running {attempt} on a {job['queue']} worker; its lease runs for another "
            f"{human_duration(seconds_between(now, lease))}{done}."
        )
    if status == "succeeded":
        took = human_duration(seconds_between(job.get("created_at"), job.get("finished_at")))
        return (
            f"Succeeded {took} after it was submitted, in {job['attempts']} attempt(s): "
            f"{job.get('result_rows')} notes, {job.get('result_bytes')} bytes."
        )
    if status == "failed":
        why = f"Failed with {code or 'an unknown error'} after {job['attempts']} attempt(s)"
        if replay is not None:
            return f"{why}. It was replayed as job {short(replay['id'])} ({replay['status']})."
        if job.get("resolved_at"):
            return f"{why}. An operator marked its dead letter resolved."
        return f"{why}. Its dead letter is open: replay it, or mark it resolved."
    if status == "cancelled":
        return "Cancelled on request; nothing was published."
    return f"Status {status}."
