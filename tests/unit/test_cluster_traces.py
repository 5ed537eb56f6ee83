"""The cluster's check of one export's trace in Jaeger (devtools/cluster/platform_drills.py,
``judge_export_trace``, used by tests/cluster's one-trace-per-export test), on trace
documents shaped like Jaeger's query API answers: a job the publisher sent and a job a
worker's claim took beside another job's message each pass; spans split over two traces or
a render outside the job's claim are problems."""

from __future__ import annotations

from typing import Any

from devtools.cluster.platform_drills import judge_export_trace

JOB = "11111111-1111-1111-1111-111111111111"
PROCESSES = {
    "p1": {"serviceName": "notes-exports-api"},
    "p2": {"serviceName": "notes-exports-publisher"},
    "p3": {"serviceName": "notes-exports-worker"},
}


def _span(
    span_id: str, name: str, process: str, parent: str | None = None, **tags: str
) -> dict[str, Any]:
    return {
        "spanID": span_id,
        "operationName": name,
        "processID": process,
        "references": [{"refType": "CHILD_OF", "traceID": "t1", "spanID": parent}]
        if parent
        else [],
        "tags": [{"key": k, "type": "string", "value": v} for k, v in tags.items()],
    }


def _job_spans(*, taken_by_claim: bool, render_parent: str = "claim") -> list[dict[str, Any]]:
    """A succeeded export's spans: sent by the publisher (its publish span, the Celery task
    span, the claim under it), or taken by another message's claim (the worker records its
    publish span, dispatched_by claim, and the claim under that)."""
    ids = {"job_id": JOB, "message_id": "m1"}
    spans = [
        _span("http", "POST /v1/exports", "p1"),
        _span("submit", "exports.submit", "p1", "http", job_id=JOB),
    ]
    if taken_by_claim:
        spans.append(
            _span("publish", "exports.publish", "p3", "submit", dispatched_by="claim", **ids)
        )
        claim_parent = "publish"
    else:
        spans += [
            _span("publish", "exports.publish", "p2", "submit", **ids),
            _span("task", "run/exports.run_export", "p3", "publish"),
        ]
        claim_parent = "task"
    leased = {**ids, "lease_token": "l1"}
    spans += [
        _span("claim", "exports.claim", "p3", claim_parent, **leased),
        _span("render", "exports.render", "p3", render_parent, **ids),
        _span("write", "exports.write", "p3", "claim", **ids),
        _span("finish", "exports.finish", "p3", "claim", **leased),
    ]
    return spans


def _traces(*parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        f"t{i}": {"traceID": f"t{i}", "spans": spans, "processes": PROCESSES}
        for i, spans in enumerate(parts, 1)
    }


def test_a_job_the_publisher_sent_has_one_whole_trace() -> None:
    found = judge_export_trace(JOB, _traces(_job_spans(taken_by_claim=False)))
    assert found["problems"] == [] and found["taken_by_claim"] is False


def test_a_job_a_claim_took_needs_no_publisher_span() -> None:
    """The publisher never sent it: its publish span is the worker's (a batch's job)."""
    found = judge_export_trace(JOB, _traces(_job_spans(taken_by_claim=True)))
    assert found["problems"] == [] and found["taken_by_claim"] is True
    assert "notes-exports-publisher" not in found["services"]


def test_a_job_the_publisher_sent_without_its_span_is_a_problem() -> None:
    spans = [s for s in _job_spans(taken_by_claim=False) if s["processID"] != "p2"]
    [problem] = judge_export_trace(JOB, _traces(spans))["problems"][:1]
    assert "lack ['notes-exports-publisher']" in problem


def test_a_render_outside_the_jobs_claim_is_a_problem() -> None:
    found = judge_export_trace(JOB, _traces(_job_spans(taken_by_claim=True, render_parent="x")))
    assert found["problems"] == [
        "['exports.render'] not children of the export's exports.claim span"
    ]


def test_a_job_split_over_two_traces_is_a_problem() -> None:
    spans = _job_spans(taken_by_claim=False)
    found = judge_export_trace(JOB, _traces(spans[:4], spans[4:]))
    assert found["problems"][0].startswith("2 traces hold spans of the export")


def _recovered(claim_token: str) -> list[dict[str, Any]]:
    """A recovered export: the scanner's lease-expiry span (the expired token l1, the
    SIGKILLed attempt's claim span missing), then a claim with ``claim_token``."""
    spans = _job_spans(taken_by_claim=False)
    for sp in spans:
        for tag in sp["tags"]:
            if tag["key"] == "lease_token":
                tag["value"] = claim_token
    return [
        *spans,
        _span(
            "lease", "exports.recovery.lease_expired", "p4", "submit", job_id=JOB, lease_token="l1"
        ),
    ]


def test_a_recovered_export_shows_the_recovery_and_a_claim_with_a_new_token() -> None:
    processes = {**PROCESSES, "p4": {"serviceName": "notes-exports-recovery-scanner"}}
    traces = {"t1": {"traceID": "t1", "spans": _recovered("l2"), "processes": processes}}
    assert judge_export_trace(JOB, traces, recovered=True)["problems"] == []
    traces["t1"]["spans"] = _recovered("l1")
    assert judge_export_trace(JOB, traces, recovered=True)["problems"] == [
        "no claim after the recovery (a lease token other than ['l1'])"
    ]
    traces["t1"]["spans"] = _job_spans(taken_by_claim=False)
    assert judge_export_trace(JOB, traces, recovered=True)["problems"] == [
        "no recovery span (lease_expired / redispatch) in the trace"
    ]
