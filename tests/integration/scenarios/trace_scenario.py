"""Run exports through the real api app, publisher, Redis and a Celery worker inside ONE
process whose spans go through the SDK's batch processor and OTLP exporter
(``OTEL_TRACES_EXPORTER=otlp``) to the test's receiver: one plain export, one retried
export, and a batch — several exports submitted at once while one message may be ahead
of the workers (``PUBLISHER_MESSAGES_AHEAD=1``), so that the claim of that one message
takes the others. Prints a JSON summary. Run by tests/integration/test_tracing.py with
DATABASE_URL, CELERY_BROKER_URL, ARTIFACT_DIR and EXPORTS_FAULTS_FILE pointing at the
test's own resources."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from exportcore import faults, telemetry

telemetry.setup_tracing("trace-test")

from celery.contrib.testing.worker import start_worker  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from exportcore.db import make_pool  # noqa: E402
from exportcore.domain import QUEUES  # noqa: E402
from exportcore.publisher import Publisher  # noqa: E402
from exportcore.settings import get_settings  # noqa: E402
from services.api.app import create_app  # noqa: E402
from services.worker import app as worker  # noqa: E402

api_key, note_id, fault_file, batch = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
settings = get_settings()
pool = make_pool(settings, "trace-scenario", open_wait=True)
publisher = Publisher(settings, pool, worker.app)
auth = {"Authorization": f"Bearer {api_key}"}


def run_to_the_end(client: TestClient, job_ids: list[str]) -> list[str]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        publisher.run_once()
        states = [
            client.get(f"/v1/exports/{job_id}", headers=auth).json()["status"] for job_id in job_ids
        ]
        if all(s in ("succeeded", "failed", "cancelled") for s in states):
            return states
        time.sleep(0.05)
    raise SystemExit(f"{job_ids} did not finish")


with (
    start_worker(worker.app, pool="solo", perform_ping_check=False, queues=list(QUEUES)),
    TestClient(create_app(settings)) as client,
):
    plain = client.post("/v1/exports", json={"note_ids": [note_id]}, headers=auth).json()["id"]
    states = run_to_the_end(client, [plain])
    faults.arm(Path(fault_file), "render.chunk", "io", times=1)
    retried = client.post(
        "/v1/exports", json={"note_ids": [note_id], "format": "ndjson"}, headers=auth
    ).json()["id"]
    states += run_to_the_end(client, [retried])
    batched = [
        client.post("/v1/exports", json={"note_ids": [note_id]}, headers=auth).json()["id"]
        for _ in range(batch)
    ]
    states += run_to_the_end(client, batched)

telemetry.flush()
with pool.connection() as conn:
    claims = conn.execute(
        "SELECT count(DISTINCT started_at) AS n FROM export_jobs WHERE id = ANY(%s::uuid[])",
        (batched,),
    ).fetchone()
print(
    json.dumps(
        {
            "plain": plain,
            "retried": retried,
            "batched": batched,
            "status": states,
            "batch_claims": claims["n"] if claims else None,
        }
    )
)
