"""Metrics from every process under gunicorn workers and recycled Celery children, and logs
that carry the ids but never a key, a connection string or note content."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import E2E, running_stack

pytestmark = pytest.mark.e2e
N = 12


@pytest.fixture(scope="module")
def observed(servers, template_db, notes_dir, tmp_path_factory) -> Iterator[E2E]:
    env = {
        "API_WORKERS": "3",
        "WORKER_MAX_TASKS_PER_CHILD": "1",
        # one job per task, so that every export runs in a fresh child (a claim would
        # otherwise take a backlog beside its message: several exports per task and child)
        "WORKER_CLAIM_JOBS": "1",
        "FAST_WORKER_CONCURRENCY": "2",
        "SCHEDULER_TICK_SECONDS": "60",
        # spans go to each process's stdout: a recycled child must flush before it exits
        "OTEL_TRACES_EXPORTER": "console",
    }
    with running_stack(
        servers, template_db, notes_dir, tmp_path_factory.mktemp("observed"), env
    ) as e:
        yield e


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url, timeout=10).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def total(samples: dict, name: str, **labels: str) -> float:
    return sum(
        v
        for (n, ls), v in samples.items()
        if n == name and all(dict(ls).get(k) == val for k, val in labels.items())
    )


def test_counters_add_up_across_gunicorn_workers_and_recycled_children(observed: E2E) -> None:
    e = observed
    with psycopg.connect(e.database_url) as conn:
        note = conn.execute(
            "SELECT min(id) FROM notes WHERE tenant_id = %s", (e.tenant,)
        ).fetchone()[0]
    with httpx.Client(base_url=e.stack.api_url, headers=e.api.auth, timeout=10) as client:
        ids = [client.post("/v1/exports", json={"note_ids": [note]}).json()["id"] for _ in range(N)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = {client.get(f"/v1/exports/{i}").json()["status"] for i in ids}
            if states == {"succeeded"}:
                break
            time.sleep(0.1)
        assert states == {"succeeded"}

    api = scrape(e.stack.metrics_url("api"))
    assert total(api, "exports_submits_total", outcome="accepted", source="api") == N
    publisher = scrape(e.stack.metrics_url("publisher"))
    assert total(publisher, "exports_publishes_total", outcome="sent", queue="exports.fast") == N
    fast = scrape(e.stack.metrics_url("fast-worker"))
    assert total(fast, "exports_claims_total", outcome="claimed", queue="exports.fast") == N
    assert total(fast, "exports_finishes_total", outcome="succeeded", queue="exports.fast") == N
    assert total(fast, "exports_pickup_seconds_count", queue="exports.fast") == N
    assert (
        total(fast, "exports_end_to_end_seconds_count", queue="exports.fast", status="succeeded")
        == N
    )
    # every task ran in a fresh child (max_tasks_per_child=1): the values survived recycling
    pid_files = {
        p.name.rsplit("_", 1)[-1]
        for p in (e.stack.log_dir / "metrics" / "fast-worker").glob("*.db")
    }
    assert len(pid_files) > N
    scanner = scrape(e.stack.metrics_url("recovery-scanner"))
    assert total(scanner, "exports_db_gauges_up") == 1
    assert total(scanner, "exports_jobs", status="succeeded", queue="exports.fast") == N
    assert total(scanner, "exports_outbox_unpublished") == 0
    for name in ("beat", "bulk-worker"):  # every process serves /metrics on its own port
        r = httpx.get(e.stack.metrics_url(name), timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")


def test_logs_carry_ids_and_never_secrets_or_note_content(observed: E2E) -> None:
    e = observed
    with psycopg.connect(e.database_url) as conn:
        content = conn.execute(
            "SELECT content FROM notes WHERE tenant_id = %s AND length(content) > 200 ORDER BY id LIMIT 1",
            (e.tenant,),
        ).fetchone()[0]
    body_line = next(line for line in content.splitlines() if len(line.strip()) > 40).strip()
    logs = "\n".join(p.log_text() for p in e.stack.procs.values())
    assert e.api.api_key not in logs and e.api.admin_key not in logs
    assert e.api.api_key.split("_", 2)[2] not in logs  # not even the secret part
    assert body_line not in logs
    assert "postgresql://postgres@" not in logs
    batches = [
        json.loads(line)
        for line in e.stack.procs["fast-worker"].log_text().splitlines()
        if line.startswith("{") and '"batch done"' in line
    ]
    assert batches, "the worker logged no batch"
    # one INFO line per delivered message (per-job lines are DEBUG), naming its jobs
    assert sum(len(r["job_ids"]) for r in batches) >= N
    for record in batches:
        assert {"message_id", "queue", "jobs", "outcomes", "job_ids", "runs", "trace_id"} <= set(
            record
        )
        assert len(record["trace_id"]) == 32
        # each job's attempt and lease token (a redelivery is told from a re-execution)
        assert [r["job_id"] for r in record["runs"]] == record["job_ids"]
        assert all(r["attempt"] and r["lease_token"] for r in record["runs"])
    assert '"job succeeded"' not in e.stack.procs["fast-worker"].log_text()


def test_recycled_children_flush_their_spans_before_exiting(observed: E2E) -> None:
    """With max_tasks_per_child=1 every child exits right after its task; the batch span
    processor would lose the spans unless the child flushes them on its way out."""
    e = observed
    with psycopg.connect(e.database_url) as conn:
        jobs = [
            str(r[0]) for r in conn.execute("SELECT id FROM export_jobs WHERE status = 'succeeded'")
        ]
    assert len(jobs) >= N
    log = e.stack.procs["fast-worker"].log_text()
    for job_id in jobs:
        assert f'"job_id": "{job_id}"' in log, f"no span of {job_id} was exported"
    assert log.count('"name": "exports.finish"') >= len(jobs)


def test_recovery_and_webhook_series_exist_at_zero_before_any_event(observed: E2E) -> None:
    """Series whose label sets are known in advance are served at 0 from the start: a
    recovery's or a delivery's first increase is then visible to rate() and increase()
    (the recovery SLO rules, the dashboards' panels), not a series born at 1."""
    for worker in ("fast-worker", "bulk-worker"):
        samples = scrape(observed.stack.metrics_url(worker))
        for kind in ("lease_expiry", "lost_dispatch"):
            key = ("exports_recovery_seconds_count", (("kind", kind),))
            assert samples.get(key) == 0.0, (worker, kind)
    hooks = scrape(observed.stack.metrics_url("webhook-delivery"))
    for outcome in ("delivered", "http_error", "timeout", "refused"):
        key = (
            "exports_webhook_deliveries_total",
            (("event_type", "export.succeeded"), ("outcome", outcome)),
        )
        assert hooks.get(key) == 0.0, outcome
        assert ("exports_webhook_attempt_seconds_count", (("outcome", outcome),)) in hooks
    assert ("exports_webhook_lag_seconds_count", (("event_type", "export.failed"),)) in hooks
