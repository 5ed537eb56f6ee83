"""One trace per export across the outbox, received by a real OTLP/HTTP receiver from the
SDK's own exporter: the submit (HTTP) span, the publisher's span, the worker's claim /
render / write / finish spans share one trace id — also when the job was retried, and for
every job of a batch that one claim took together (each has its own publish span, linked
to the message that carried the claim, and its own claim span, parent of the rest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exportcore.auth import create_api_key
from tests.support import (
    OtlpReceiver,
    assert_batch_traces,
    assert_claim_tree,
    one_trace,
    tenant_with_notes,
    trace_gaps,
    wait_for,
)

SCENARIO = Path(__file__).parent / "scenarios" / "trace_scenario.py"
BATCH = 4


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


@pytest.fixture
def traced(settings, pool, notes_dir, tmp_path, receiver) -> tuple[dict[str, Any], list[dict]]:
    """The scenario's summary and every span the receiver got from it."""
    tid, ids = tenant_with_notes(pool, notes_dir)
    with pool.connection() as conn:
        key, _ = create_api_key(conn, tenant_id=tid, scopes=["exports:read", "exports:write"])
    fault_file = tmp_path / "faults.json"
    env = {
        **os.environ,
        "DATABASE_URL": str(settings.database_url),
        "CELERY_BROKER_URL": settings.broker_url,
        "ARTIFACT_DIR": str(settings.artifact_dir),
        "EXPORTS_FAULTS_FILE": str(fault_file),
        "RETRY_BASE_SECONDS": "0.05",
        "RETRY_CAP_SECONDS": "0.1",
        "PUBLISHER_MESSAGES_AHEAD": "1",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "PYTHONPATH": str(Path(__file__).parents[2]),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.run(
        [sys.executable, str(SCENARIO), key, str(ids[0]), str(fault_file), str(BATCH)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = next(json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))
    assert summary["status"] == ["succeeded"] * (2 + BATCH)
    jobs = [summary["plain"], summary["retried"], *summary["batched"]]
    wait_for(
        lambda: not trace_gaps(receiver.spans(), jobs),
        10,
        "every export's spans reached the receiver",
        detail=lambda: "\n".join(trace_gaps(receiver.spans(), jobs)),
    )
    return summary, receiver.spans()


def test_one_trace_per_export_including_a_retry_and_every_job_of_a_batch(traced) -> None:
    """One scenario run (a subprocess of the whole path) serves both checks."""
    summary, spans = traced
    _assert_plain_and_retried(summary, spans)
    _assert_batched(summary, spans)


def _assert_plain_and_retried(summary: dict[str, Any], spans: list[dict]) -> None:
    for job_id, attempts in ((summary["plain"], 1), (summary["retried"], 2)):
        mine, whole = one_trace(spans, job_id)
        names = [s["name"] for s in mine]
        assert names.count("exports.submit") == 1
        assert names.count("exports.publish") == attempts
        whole_names = {s["name"] for s in whole.values()}
        assert "POST /v1/exports" in whole_names  # the HTTP request span from FastAPI
        assert any(n.startswith("run/") for n in whole_names)  # the Celery task span
        submit = next(s for s in mine if s["name"] == "exports.submit")
        assert whole[submit["parent_id"]]["name"].startswith("POST /v1/exports")
        for publish in (s for s in mine if s["name"] == "exports.publish"):
            assert publish["parent_id"] == submit["span_id"]  # child of the stored submit context
            assert publish["attributes"]["message_id"]
        claims = [s for s in mine if s["name"] == "exports.claim"]
        for claim in claims:  # a child of the Celery task span of its message
            assert whole[claim["parent_id"]]["name"].startswith("run/")
        assert sorted(c["attributes"]["attempt"] for c in claims) == [
            str(a) for a in range(1, attempts + 1)
        ]
        publish_ids = {
            s["attributes"]["message_id"] for s in mine if s["name"] == "exports.publish"
        }
        assert {c["attributes"]["message_id"] for c in claims} == publish_ids
        assert_claim_tree(mine, attempts)


def _assert_batched(summary: dict[str, Any], spans: list[dict]) -> None:
    """Each job of the batch: its own publish span and its own claim span in its own
    trace; one claim took them all."""
    assert summary["batch_claims"] == 1  # one claim took the whole batch
    [batch] = assert_batch_traces(spans, summary["batched"])
    assert len(batch) == BATCH
