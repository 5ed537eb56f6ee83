"""The console's pure logic: timeline steps, the explanation of a job's state, sanitised
details, durations, the jobs page's filters, and the sign-in redirect target."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from starlette.datastructures import QueryParams

from services.api.console.auth import safe_next
from services.api.console.jobs import parse_filters
from services.api.console.overview import Spark
from services.api.console.timeline import (
    build_timeline,
    explain,
    human_duration,
    sanitise_detail,
)

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def ev(kind: str, seconds: float, **kw: object) -> dict[str, object]:
    return {
        "kind": kind,
        "at": T0 + timedelta(seconds=seconds),
        "attempt": kw.pop("attempt", None),
        "lease_token": kw.pop("lease_token", None),
        "message_id": kw.pop("message_id", None),
        "to_status": kw.pop("to_status", None),
        "detail": kw.pop("detail", {}),
    }


JOB = {"max_attempts": 3, "note_count": 40, "error_code": None}


def test_a_retried_then_failed_history_reads_step_by_step() -> None:
    token = uuid4()
    events = [
        ev("submitted", 0, detail={"source": "api", "note_count": 40}),
        ev("dispatched", 0.01, detail={"reason": "submit", "dispatch_count": 1}),
        ev("claimed", 0.2, attempt=1, lease_token=token),
        ev("renewed", 10, attempt=1, detail={"progress": 10}),
        ev("renewed", 20, attempt=1, detail={"progress": 20}),
        ev("renewed", 30, attempt=1, detail={"progress": 30}),
        ev(
            "retried",
            31,
            attempt=1,
            detail={
                "error_code": "io_error",
                "next_attempt_at": (T0 + timedelta(seconds=35)).isoformat(),
            },
        ),
        ev("claimed", 35.5, attempt=2),
        ev("failed", 36, attempt=2, detail={"error_code": "bad", "error_detail": "token=abc"}),
        ev("dead_lettered", 36),
    ]
    steps = build_timeline(JOB, events)
    assert [s.kind for s in steps] == [
        "submitted",
        "dispatched",
        "claimed",
        "renewed",
        "retried",
        "claimed",
        "failed",
        "dead_lettered",
    ]
    renewed = steps[3]
    assert renewed.count == 3 and renewed.title == "Lease renewed 3 times"
    assert renewed.last_at == T0 + timedelta(seconds=30) and "30 of 40 notes" in renewed.text
    assert steps[4].gap == pytest.approx(1.0)  # from the last renewal, not the first
    assert steps[4].wait == pytest.approx(4.0) and steps[4].tone == "warn"
    assert steps[2].title == "Claimed: attempt 1 of 3" and str(token)[:8] in steps[2].text
    assert steps[6].title == "Failed: bad" and "abc" not in steps[6].text
    assert steps[0].gap is None


def test_a_replay_links_both_ways() -> None:
    original, replay = uuid4(), uuid4()
    steps = build_timeline(
        JOB, [ev("submitted", 0, detail={"source": "replay", "replay_of": str(original)})]
    )
    assert steps[0].links == {"replay_of": str(original)}
    steps = build_timeline(JOB, [ev("replayed", 0, detail={"replayed_by": str(replay)})])
    assert steps[0].links == {"replayed_by": str(replay)}


def test_a_cancel_step_says_whether_the_job_was_queued_or_running() -> None:
    queued = {
        **ev("cancel_requested", 1, detail={"requested_by": "tenant"}),
        "from_status": "queued",
    }
    running = {
        **ev("cancel_requested", 1, detail={"requested_by": "operator", "bulk_id": 7}),
        "from_status": "running",
    }
    (step,) = build_timeline(JOB, [queued])
    assert step.title == "Cancel requested by the tenant"
    assert "cancelled at once" in step.text and "chunk" not in step.text
    (step,) = build_timeline(JOB, [running])
    assert step.title == "Cancel requested by an operator (bulk action 7)"
    assert "next chunk boundary" in step.text


def test_an_unknown_event_kind_is_shown_as_it_is() -> None:
    (step,) = build_timeline(JOB, [ev("something_new", 0, detail={"x": 1})])
    assert step.title == "Something new" and "'x': 1" in step.text


def job(status: str, **kw: object) -> dict[str, object]:
    base = {
        "status": status,
        "attempts": 1,
        "max_attempts": 3,
        "queue": "exports.fast",
        "note_count": 40,
        "error_code": None,
        "cancel_requested": False,
        "next_attempt_at": T0,
        "last_dispatched_at": None,
        "lease_expires_at": None,
        "progress": None,
        "created_at": T0,
        "finished_at": None,
        "result_rows": None,
        "result_bytes": None,
    }
    return base | kw


@pytest.mark.parametrize(
    ("row", "replay", "expected"),
    [
        (
            job("queued", next_attempt_at=T0 + timedelta(seconds=8), error_code="io_error"),
            None,
            "Waiting out a retry backoff after attempt 1 of 3 failed with io_error; it is due again in 8.0 s.",
        ),
        (
            job("queued", last_dispatched_at=T0 - timedelta(seconds=3)),
            None,
            "Queued on exports.fast, waiting for a worker; its message was last sent 3.0 s ago.",
        ),
        (job("queued"), None, "its first message has not been published yet"),
        (job("queued", cancel_requested=True), None, "the recovery-scanner cancels it"),
        (
            job("running", lease_expires_at=T0 + timedelta(seconds=20), progress=10),
            None,
            "Running attempt 1 of 3 on a exports.fast worker; its lease runs for another 20 s; 10 of 40 notes rendered.",
        ),
        (
            job("running", lease_expires_at=T0 - timedelta(seconds=5)),
            None,
            "The lease of attempt 1 of 3 expired 5.0 s ago",
        ),
        (job("running", cancel_requested=True, lease_expires_at=T0), None, "next chunk boundary"),
        (
            job("succeeded", finished_at=T0 + timedelta(seconds=2), result_rows=40, result_bytes=9),
            None,
            "Succeeded 2.0 s after it was submitted, in 1 attempt(s): 40 notes, 9 bytes.",
        ),
        (job("failed", error_code="boom"), None, "Its dead letter is open"),
        (job("failed", error_code="boom", resolved_at=T0), None, "marked its dead letter resolved"),
        (
            job("failed", error_code="boom"),
            {"id": "0123456789", "status": "running"},
            "It was replayed as job 01234567 (running).",
        ),
        (job("cancelled"), None, "Cancelled on request"),
    ],
)
def test_explain_says_why_a_job_is_where_it_is(row, replay, expected) -> None:
    assert expected in explain(row, T0, replay)


@pytest.mark.parametrize(
    ("text", "leaked"),
    [
        ("key nex_ab12cd34_Zm9vYmFyYmF6cXV4 refused", "Zm9vYmFyYmF6cXV4"),
        ("connect postgresql://app:s3cret@db:5432/x failed", "s3cret"),
        ("password=hunter2; user=x", "hunter2"),
        ('secret_access_key: "abc/def"', "abc/def"),
        ("AKIAABCDEFGHIJKLMNOP denied", "AKIAABCDEFGHIJKLMNOP"),
        ("Authorization: Bearer eyJhbGciOi.payload.sig", "eyJhbGciOi"),
    ],
)
def test_sanitise_redacts_secrets(text: str, leaked: str) -> None:
    out = sanitise_detail(text)
    assert leaked not in out and "redacted" in out


def test_sanitise_strips_control_and_bidi_characters_and_bounds_length() -> None:
    assert sanitise_detail("a\x1b[31mb\u202ec\nd\te") == "a[31mbc\nd\te"
    long = sanitise_detail("x" * 5000, limit=100)
    assert long.startswith("x" * 100) and long.endswith("(4900 more characters)")
    assert sanitise_detail(None) == "" and sanitise_detail("plain words") == "plain words"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "—"),
        (0.25, "250 ms"),
        (4.25, "4.2 s"),
        (42, "42 s"),
        (185, "3 min 5 s"),
        (120, "2 min"),
        (7800, "2 h 10 min"),
        (3600, "1 h"),
        (90000, "1 d 1 h"),
        (-30, "30 s"),
    ],
)
def test_human_duration(seconds, text) -> None:
    assert human_duration(seconds) == text


def test_filters_are_parsed_and_bad_values_reported() -> None:
    now = T0
    f = parse_filters(
        QueryParams(
            "status=failed&queue=exports.bulk&tenant=acme&error_code=boom"
            "&from=2026-11-30T08:00:00Z&to_local=2026-12-01T09:30"
        ),
        now,
    )
    assert (f.status, f.queue, f.tenant_id, f.error_code) == (
        "failed",
        "exports.bulk",
        "acme",
        "boom",
    )
    assert f.created_from == datetime(2026, 11, 30, 8, tzinfo=UTC)
    assert f.created_to == datetime(2026, 12, 1, 9, 30, tzinfo=UTC)  # no zone given: UTC
    assert f.errors == [] and f.params["to"] == "2026-12-01T09:30"
    since = parse_filters(QueryParams("since=24h"), now)
    assert since.created_from == now - timedelta(hours=24)
    bad = parse_filters(QueryParams("status=lost&queue=x&since=1y&from=noon"), now)
    assert bad.status is None and bad.queue is None and len(bad.errors) == 4


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/console/jobs?status=failed", "/console/jobs?status=failed"),
        ("https://evil.example/console", "/console/"),
        ("//evil.example", "/console/"),
        ("/console//evil.example", "/console/"),
        ("/console\\..\\x", "/console/"),
        ("/console/login", "/console/"),
        (None, "/console/"),
    ],
)
def test_sign_in_goes_back_to_console_pages_only(target, expected) -> None:
    assert safe_next(target) == expected


def test_sparkline_bars_scale_to_the_busiest_minute() -> None:
    minutes = [T0 + timedelta(minutes=i) for i in range(3)]
    spark = Spark(minutes=minutes, succeeded=[0, 4, 2], failed=[0, 0, 2], width=300, height=40)
    bars = spark.bars()
    assert spark.peak == 4 and [b["hs"] for b in bars] == [0, 40, 20]
    assert bars[2]["hf"] == 20 and bars[2]["yf"] == 0
    assert "6 succeeded, 2 failed" in spark.summary
