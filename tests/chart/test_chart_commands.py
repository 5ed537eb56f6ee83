"""The chart's own commands really run.

The chart is rendered with the test PostgreSQL and Redis as its connection settings; for each
component the Deployment's container args, environment (ConfigMap + Secret + env, exactly as
rendered) and probes are taken from the YAML and run here (``tests/chart/commands.py``): the
args as the process, each probe (HTTP or exec) until it passes. Then the preStop hook and
TERM are applied to each worker while it is in the middle of an export: the export still
succeeds (Celery warm shutdown) and the process exits within the rendered
terminationGracePeriodSeconds.

Only the container's volumes are mapped to local folders (``/run/notes-exports``, the
artifact mount, ``/tmp`` as TMPDIR) and the listening address to a free loopback port.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import httpx
import psycopg
import pytest

from devtools.stack import Servers
from tests.chart.commands import (
    Deployment,
    check_clean_stop,
    check_every_probe,
    job_status,
    launch,
    run_exec,
    wait_probe,
)
from tests.chart.conftest import CHART, COMPONENT_KEYS, render

pytestmark = [pytest.mark.chart, pytest.mark.e2e]

COMPONENTS = COMPONENT_KEYS  # every component of the chart runs here
WORKERS = {"fastWorker": "exports.fast", "bulkWorker": "exports.bulk"}


@pytest.fixture(scope="module")
def deployment(
    servers: Servers, template_db: str, notes_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    import redis

    db = f"chart_{uuid4().hex[:12]}"
    database_url = servers.create_database(db, template=template_db)
    broker_url = servers.redis_url(0)
    redis.Redis.from_url(broker_url).flushdb()
    objs = render(
        [CHART / "ci" / "default-values.yaml"],
        # the test servers' Redis has no password (a throwaway one): said explicitly
        {"database.url": database_url, "broker.url": broker_url, "broker.allowNoPassword": True},
    )
    base = tmp_path_factory.mktemp("chart-run")
    try:
        with launch(
            objs, COMPONENTS, base=base, database_url=database_url, notes_dir=notes_dir
        ) as dep:
            yield dep
    finally:
        servers.drop_database(db)


@pytest.mark.parametrize("key", COMPONENTS)
def test_every_probe_of_the_rendered_chart_passes(deployment: Deployment, key: str) -> None:
    check_every_probe(deployment.components[key])


@pytest.mark.parametrize("key", list(WORKERS))
def test_worker_prestop_and_term_mid_export_finish_the_export(
    deployment: Deployment, key: str
) -> None:
    worker = deployment.components[key]
    proc = worker.process
    wait_probe(worker, "readinessProbe", budget=60)
    children = proc.children()
    assert children, "a prefork worker has pool processes"
    if key == "fastWorker":
        body = {"note_ids": deployment.note_ids[:30], "format": "markdown_zip"}
    else:
        body = {"all": True, "format": "markdown_zip"}
    headers = {"Authorization": f"Bearer {deployment.api_key}"}

    # Freeze the pool processes while the export is being rendered (claimed, not finished).
    job_id = None
    with (
        psycopg.connect(deployment.database_url, autocommit=True) as conn,
        httpx.Client(base_url=deployment.api_url(), headers=headers, timeout=10) as client,
    ):
        for _attempt in range(15):
            r = client.post("/v1/exports", json=body)
            assert r.status_code == 202, r.text
            assert r.json()["queue"] == WORKERS[key]
            candidate = r.json()["id"]
            deadline = time.monotonic() + 30
            status = "queued"
            while status == "queued" and time.monotonic() < deadline:
                status, _ = job_status(conn, candidate)
            if status == "running":
                for child in children:
                    os.kill(child, signal.SIGSTOP)
                status, _ = job_status(conn, candidate)
                if status == "running":
                    job_id = candidate
                    break
                for child in children:
                    os.kill(child, signal.SIGCONT)
            assert status in ("running", "succeeded"), status
        assert job_id is not None, "never caught an export in the middle of rendering"

        try:
            # Kubernetes: preStop hook first, then TERM to the container's main process.
            started = time.monotonic()
            pre = worker.container["lifecycle"]["preStop"]["exec"]["command"]
            hook = run_exec(worker, pre, timeout=worker.grace)
            assert hook.returncode == 0, hook.stdout + hook.stderr
            assert f"no longer consuming from {WORKERS[key]}" in hook.stdout, hook.stdout
            proc.signal(signal.SIGTERM)
            time.sleep(2)
            assert proc.alive, "the worker must wait for the export in hand (warm shutdown)"
            assert job_status(conn, job_id)[0] == "running"
        finally:
            for child in children:
                os.kill(child, signal.SIGCONT)
        code = proc.wait(worker.grace - (time.monotonic() - started))
        elapsed = time.monotonic() - started
        assert code == 0, f"exit {code} after {elapsed:.1f}s\n{proc.log_text()[-4000:]}"
        assert elapsed < worker.grace
        status, attempts = job_status(conn, job_id)
        assert (status, attempts) == ("succeeded", 1), proc.log_text()[-4000:]
        assert "Warm shutdown" in proc.log_text()

        final = client.get(f"/v1/exports/{job_id}").json()
        data = client.get(f"/v1/exports/{job_id}/download").content
        assert hashlib.sha256(data).hexdigest() == final["result"]["sha256"]


@pytest.mark.parametrize("key", [k for k in COMPONENTS if k not in WORKERS])
def test_other_components_stop_cleanly_within_their_grace_period(
    deployment: Deployment, key: str
) -> None:
    check_clean_stop(deployment.components[key])
