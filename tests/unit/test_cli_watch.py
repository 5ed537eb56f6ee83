"""What ``exportctl watch`` shows beside the status: a running export's progress from its
history (notes done of total, rate, ETA) and, while queued for a retry, the next attempt."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console

from exportctl.exports import JobProgress, progress_of, watch_table

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def iso(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def job(status: str, attempts: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": "00000000-0000-4000-8000-000000000001",
        "status": status,
        "format": "json",
        "queue": "exports",
        "note_count": 1000,
        "attempts": attempts,
        "max_attempts": 5,
        "created_at": iso(-60),
        "started_at": iso(0),
        "finished_at": None,
        "next_attempt_at": iso(0),
        "error": None,
        "result": None,
        **extra,
    }


def event(kind: str, at: float, attempt: int, progress: int | None = None) -> dict[str, Any]:
    return {
        "id": int(at * 10) + attempt,
        "at": iso(at),
        "kind": kind,
        "from_status": "queued" if kind == "claimed" else None,
        "to_status": "running" if kind == "claimed" else None,
        "attempt": attempt,
        "detail": {} if progress is None else {"progress": progress},
    }


def text(j: dict[str, Any], history: list[dict[str, Any]], now: datetime) -> str:
    console = Console(file=io.StringIO(), record=True, width=200)
    console.print(watch_table(j, history, now))
    return console.export_text()


def test_progress_is_measured_from_the_current_attempts_claim_on_the_server_clock() -> None:
    history = [
        event("claimed", 0, 1),
        event("renewed", 10, 1, 900),  # the failed first attempt: ignored
        event("claimed", 100, 2),
        event("renewed", 110, 2, 200),
        event("renewed", 120, 2, 400),
    ]
    got = progress_of(job("running", 2), history)
    assert got == JobProgress(done=400, total=1000, rate=20.0, eta=30.0)
    shown = text(job("running", 2), history, T0)
    assert "400 of 1000 notes (40%), 20.0 notes/s, ETA 30 s" in shown


def test_progress_before_the_first_renewal_has_no_rate_and_only_while_running() -> None:
    assert progress_of(job("running", 1), [event("claimed", 0, 1)]) == JobProgress(
        0, 1000, None, None
    )
    assert progress_of(job("running", 1), []) == JobProgress(0, 1000, None, None)
    assert "0 of 1000 notes (0%)" in text(job("running", 1), [], T0)
    assert "ETA" not in text(job("running", 1), [], T0)
    for status in ("queued", "succeeded", "failed", "cancelled"):
        assert progress_of(job(status, 1), [event("renewed", 5, 1, 10)]) is None
        assert "progress" not in text(job(status, 1), [event("renewed", 5, 1, 10)], T0)


def test_a_queued_retry_shows_the_next_attempt_time_and_the_attempts_left() -> None:
    retrying = job("queued", 2, next_attempt_at=iso(45))
    shown = text(retrying, [], T0)
    assert "attempt 3 of 5 at 2026-12-01 12:00:45 (in 45 s); 3 attempt(s) left" in shown
    overdue = text(retrying, [], T0 + timedelta(minutes=5))
    assert "(in 0 s)" in overdue
    assert "retry" not in text(job("queued", 0), [], T0)  # a first attempt is no retry
