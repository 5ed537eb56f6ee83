"""Run one export (and one retried export) through the real api app, publisher, Redis and a
Celery worker inside ONE process whose spans go to an in-memory exporter; print the spans as
JSON lines. Run by tests/integration/test_tracing.py with DATABASE_URL, CELERY_BROKER_URL,
ARTIFACT_DIR and EXPORTS_FAULTS_FILE pointing at the test's own resources."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from exportcore import faults, telemetry

exporter = InMemorySpanExporter()
telemetry.setup_tracing("trace-test", exporter=exporter)

from celery.contrib.testing.worker import start_worker  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from exportcore.db import make_pool  # noqa: E402
from exportcore.publisher import Publisher  # noqa: E402
from exportcore.settings import QUEUES, get_settings  # noqa: E402
from services.api.app import create_app  # noqa: E402
from services.worker import app as worker  # noqa: E402

api_key, note_id, fault_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
settings = get_settings()
pool = make_pool(settings, "trace-scenario", open_wait=True)
publisher = Publisher(settings, pool, worker.app)


def run_to_the_end(client: TestClient, job_id: str) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        publisher.run_once()
        status = client.get(
            f"/v1/exports/{job_id}", headers={"Authorization": f"Bearer {api_key}"}
        ).json()["status"]
        if status in ("succeeded", "failed", "cancelled"):
            return str(status)
        time.sleep(0.05)
    raise SystemExit(f"{job_id} did not finish")


with (
    start_worker(worker.app, pool="solo", perform_ping_check=False, queues=list(QUEUES)),
    TestClient(create_app(settings)) as client,
):
    auth = {"Authorization": f"Bearer {api_key}"}
    plain = client.post("/v1/exports", json={"note_ids": [note_id]}, headers=auth).json()["id"]
    plain_status = run_to_the_end(client, plain)
    faults.arm(Path(fault_file), "render.chunk", "io", times=1)
    retried = client.post(
        "/v1/exports", json={"note_ids": [note_id], "format": "ndjson"}, headers=auth
    ).json()["id"]
    retried_status = run_to_the_end(client, retried)

telemetry.flush()
print(json.dumps({"plain": plain, "retried": retried, "status": [plain_status, retried_status]}))
for span in exporter.get_finished_spans():
    print(
        json.dumps(
            {
                "name": span.name,
                "trace_id": format(span.context.trace_id, "032x"),
                "span_id": format(span.context.span_id, "016x"),
                "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                "attributes": {k: str(v) for k, v in (span.attributes or {}).items()},
            }
        )
    )
