"""The workers page's data (``exportcore.workers``, ``GET /v1/admin/workers``,
``/console/workers``) against a real Celery worker process: the broker knows it, it answers
with its queue, the export job it holds while running it and its liveness file's
heartbeat; a stopped worker is gone, and an unreachable broker answers in bounded time."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.stack import ManagedProcess
from exportcore import workers
from exportcore.auth import create_operator_key
from exportcore.broker import make_celery
from exportcore.publisher import Publisher
from exportcore.settings import Settings
from tests.support import fast_worker, submit, wait_for

NODE = f"fast@{socket.gethostname()}"


@pytest.fixture
def worker(
    settings: Settings, database_url: str, broker_url: str, artifact_dir: Path, tmp_path: Path
) -> Iterator[tuple[ManagedProcess, Path]]:
    """A real fast-worker (one process) with a liveness file and a failpoint that holds its
    first export for 8 s before it claims it (the job stays in hand meanwhile)."""
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"worker.before_claim": {"remaining": 1, "fault": "sleep:8"}}))
    hb = tmp_path / "run" / "heartbeat"
    proc, _ = fast_worker(
        database_url,
        broker_url,
        artifact_dir,
        tmp_path / "logs",
        {"HEARTBEAT_FILE": str(hb), "EXPORTS_FAULTS_FILE": str(faults)},
    )
    try:
        yield proc, hb
    finally:
        if proc.alive:
            assert proc.stop(30) == 0, proc.log_text()[-3000:]


def _answered(settings: Settings) -> workers.WorkerInfo | None:
    found = [w for w in workers.list_workers(settings).workers if w.name == NODE]
    return found[0] if found and found[0].answered and found[0].heartbeat_at else None


def test_a_real_worker_is_listed_with_its_queue_jobs_in_hand_and_heartbeat(
    worker, settings, pool, tenant, api
) -> None:
    proc, hb = worker
    detail = lambda: proc.log_text()[-3000:]  # noqa: E731
    wait_for(lambda: _answered(settings), 60, "the worker's answer", interval=0.5, detail=detail)
    idle = _answered(settings)
    assert idle is not None
    assert (idle.host, idle.queues, idle.jobs_in_hand) == (
        socket.gethostname(),
        ["exports.fast"],
        0,
    )
    assert idle.concurrency == 1 and idle.liveness_file is True
    assert idle.heartbeat_age_seconds is not None and idle.heartbeat_age_seconds < 30
    assert abs(idle.heartbeat_at.timestamp() - hb.stat().st_mtime) < 1

    job = submit(pool, settings, tenant[0], tenant[1][:1])
    publisher = Publisher(settings, pool, make_celery(settings))
    assert publisher.run_once()["published"] == 1
    publisher.flush()

    def holding() -> bool:
        w = _answered(settings)
        return w is not None and str(job["id"]) in w.active_jobs

    wait_for(holding, 30, "the worker holding the export", interval=0.2, detail=detail)
    held = _answered(settings)
    assert held is not None and held.jobs_in_hand == 1

    # the API and the console show the same, to a viewer too
    client, _, operator = api
    r = client.get("/v1/admin/workers", headers=operator)
    assert r.status_code == 200, r.text
    [listed] = [w for w in r.json()["workers"] if w["name"] == NODE]
    assert listed["answered"] and listed["queues"] == ["exports.fast"]
    assert r.json()["error"] is None
    assert client.get("/v1/admin/workers").status_code == 401
    with pool.connection() as conn:
        viewer, _ = create_operator_key(conn, label="vera", role="viewer")
    seen = client.get("/v1/admin/workers", headers={"Authorization": f"Bearer {viewer}"})
    assert seen.status_code == 200 and NODE in {w["name"] for w in seen.json()["workers"]}

    # a worker that stopped cleanly unbinds its mailbox: it is no longer listed
    assert proc.stop(30) == 0, detail()
    wait_for(
        lambda: all(w.name != NODE for w in workers.list_workers(settings).workers),
        30,
        "the stopped worker gone from the list",
        interval=0.5,
    )


def test_an_unreachable_broker_answers_in_bounded_time_with_an_error(settings) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    dead = settings.model_copy(update={"celery_broker_url": f"redis://127.0.0.1:{port}/0"})
    t0 = time.monotonic()
    report = workers.list_workers(dead, timeout=0.5)
    assert time.monotonic() - t0 < 5
    assert report.workers == [] and report.error and "did not answer" in report.error
