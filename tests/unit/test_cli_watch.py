"""What ``exportctl watch`` shows beside the status: a running export's progress from its
history (notes done of total, rate, ETA) and, while queued for a retry, the next attempt;
and, for scripts, the export as JSON (``--output json``) or each change as a JSON line."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from exportctl import exports
from exportctl.exports import JobProgress, progress_of, watch_table
from exportctl.main import app

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
    assert "attempt 3 of 5 at 2026-12-01 12:00:45 (in 45 s); 3 attempts left" in shown
    overdue = text(retrying, [], T0 + timedelta(minutes=5))
    assert "(in 0 s)" in overdue
    assert "retry" not in text(job("queued", 0), [], T0)  # a first attempt is no retry


def polled(states: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make ``watch`` read ``states`` one poll after another (no API, no sleeping); returns
    the paths it asked for."""
    answers: Iterator[dict[str, Any]] = iter(states)
    asked: list[str] = []

    def get(api_url: str, api_key: str, path: str) -> dict[str, Any]:
        asked.append(path)
        return next(answers)

    monkeypatch.setattr(exports, "_get", get)
    monkeypatch.setattr(exports.time, "sleep", lambda _: None)
    return asked


def test_watch_as_json_lines_prints_each_change_and_as_json_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queued = job("queued", 0)
    running = job("running", 1)
    halfway = running | {"progress": {"done": 500, "total": 1000}}
    done = job("succeeded", 1, finished_at=iso(30))
    states = [queued, queued, running, running, halfway, done]
    asked = polled(states, monkeypatch)
    lines = CliRunner().invoke(app, ["watch", queued["id"], "--output", "jsonl", "--api-key", "k"])
    assert lines.exit_code == 0, lines.output
    assert [json.loads(line) for line in lines.stdout.splitlines()] == [
        queued,
        running,
        halfway,
        done,
    ]
    assert set(asked) == {f"/v1/exports/{queued['id']}"} and len(asked) == len(states)
    polled([running, job("failed", 1, error={"code": "boom"})], monkeypatch)
    final = CliRunner().invoke(app, ["watch", queued["id"], "--json", "--api-key", "k"])
    assert final.exit_code == 3  # the exit code still says how it ended
    assert json.loads(final.stdout)["error"] == {"code": "boom"}


def test_watch_as_json_prints_the_export_as_it_was_at_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queued = job("queued", 0)
    polled([queued], monkeypatch)
    r = CliRunner().invoke(
        app, ["watch", queued["id"], "--output", "json", "--timeout", "0", "--api-key", "k"]
    )
    assert r.exit_code == 8 and "still queued after 0 s" in r.stderr
    assert json.loads(r.stdout) == queued
