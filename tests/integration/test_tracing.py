"""One trace per export across the outbox: the submit (HTTP) span, the publisher's span, the
worker's claim/render/finish spans share one trace id — also when the job was retried."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from exportcore.auth import create_api_key
from tests.support import tenant_with_notes

SCENARIO = Path(__file__).parent / "scenarios" / "trace_scenario.py"


def test_one_trace_per_export_including_a_retry(settings, pool, notes_dir, tmp_path) -> None:
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
        "OTEL_TRACES_EXPORTER": "none",
        "PYTHONPATH": str(Path(__file__).parents[2]),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.run(
        [sys.executable, str(SCENARIO), key, str(ids[0]), str(fault_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    summary, spans = lines[0], lines[1:]
    assert summary["status"] == ["succeeded", "succeeded"]

    for job_id, attempts in ((summary["plain"], 1), (summary["retried"], 2)):
        mine = [s for s in spans if s["attributes"].get("job_id") == job_id]
        names = [s["name"] for s in mine]
        assert names.count("exports.submit") == 1
        assert names.count("exports.publish") == attempts
        assert names.count("exports.claim") == attempts
        assert names.count("exports.finish") == 1
        traces = {s["trace_id"] for s in mine}
        assert len(traces) == 1, f"spans of {job_id} spread over {len(traces)} traces"
        trace_id = traces.pop()
        whole = [s for s in spans if s["trace_id"] == trace_id]
        whole_names = {s["name"] for s in whole}
        assert "POST /v1/exports" in whole_names  # the HTTP request span from FastAPI
        assert any(n.startswith("run/") for n in whole_names)  # the Celery task span
        by_id = {s["span_id"]: s for s in whole}
        submit = next(s for s in mine if s["name"] == "exports.submit")
        assert by_id[submit["parent_id"]]["name"].startswith("POST /v1/exports")
        for publish in (s for s in mine if s["name"] == "exports.publish"):
            assert publish["parent_id"] == submit["span_id"]  # child of the stored submit context
            assert publish["attributes"]["message_id"]
        claims = [s for s in mine if s["name"] == "exports.claim"]
        finish = next(s for s in mine if s["name"] == "exports.finish")
        for span in [*claims, finish]:
            assert {"job_id", "lease_token", "attempt", "queue", "tenant_id"} <= set(
                span["attributes"]
            )
        assert all(c["attributes"]["message_id"] for c in claims)
        assert sorted(c["attributes"]["attempt"] for c in claims) == [
            str(a) for a in range(1, attempts + 1)
        ]
        publish_ids = {
            s["attributes"]["message_id"] for s in mine if s["name"] == "exports.publish"
        }
        assert {c["attributes"]["message_id"] for c in claims} == publish_ids
