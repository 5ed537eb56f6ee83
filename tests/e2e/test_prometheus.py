"""A real Prometheus (the Debian binary, on loopback) scrapes every process of a live stack
while a workload runs — plain exports, a retry, a dead letter, a lease recovery and a lost
dispatch. Then every expression of the dashboards and the alert rules must parse and (for
the dashboards) return data, every rule must evaluate healthily, and the counters summed by
Prometheus across gunicorn workers and Celery children must match what happened."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from devtools.grafana import ALERTS, dashboard_expressions, rule_expressions
from devtools.stack import DEFAULT_PROCESSES, free_port
from devtools.webhook_receiver import Receiver
from exportcore import faults
from exportcore.domain import FAST_QUEUE, TERMINAL_STATES
from tests.e2e.conftest import E2E, failpoint_stack
from tests.support import wait_for

pytestmark = pytest.mark.e2e
SCRAPED = DEFAULT_PROCESSES  # every process of the Procfile


@pytest.fixture(scope="module")
def stack(servers, template_db, notes_dir, tmp_path_factory) -> Iterator[tuple[E2E, Path]]:
    base = tmp_path_factory.mktemp("prom")
    env = {
        "API_WORKERS": "2",
        # the webhook panels need deliveries: a receiver on loopback gets every event
        "WEBHOOK_ALLOW_HTTP": "true",
        "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true",
    }
    with failpoint_stack(servers, template_db, notes_dir, base, env) as s:
        yield s


@pytest.fixture(scope="module")
def prometheus(stack, tmp_path_factory) -> Iterator[str]:
    e, _ = stack
    binary = shutil.which("prometheus")
    assert binary, "the Debian prometheus package is required (make test installs it)"
    base = tmp_path_factory.mktemp("prometheus")
    scrape_configs = []
    for name in SCRAPED:
        url = httpx.URL(e.stack.metrics_url(name))
        scrape_configs.append(
            {
                "job_name": name,
                "metrics_path": url.path,
                "static_configs": [{"targets": [f"{url.host}:{url.port}"]}],
            }
        )
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in sorted(ALERTS.glob("*.yaml"))],
        "scrape_configs": scrape_configs,
    }
    (base / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(base / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={base / 'prometheus.yml'}",
            f"--storage.tsdb.path={base / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), 30, "prometheus ready")
        # Targets are discovered a few seconds after start: wait until every one was scraped.
        wait_for(lambda: len(query(url, "up == 1")) == len(SCRAPED), 60, "every target scraped")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def query(url: str, expr: str) -> list[dict]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    return body["data"]["result"]


def wait_scrapes(url: str, n: int) -> None:
    """Wait until every target has been scraped ``n`` more times."""
    start = scalar(url, "min(timestamp(up))")
    wait_for(lambda: scalar(url, "min(timestamp(up))") >= start + n, 30, f"{n} more scrapes")


def scalar(url: str, expr: str) -> float:
    result = query(url, expr)
    return float(result[0]["value"][1]) if result else float("nan")


class Workload:
    """Runs the drills of the workload on the live stack and remembers what happened."""

    def __init__(self, e: E2E, fault_file: Path) -> None:
        self.e, self.fault_file = e, fault_file
        self.client = e.api.http(timeout=10)
        self.notes = e.note_ids(5)
        self.accepted: list[str] = []

    def submit(self, body: dict | None = None) -> str:
        job_id = self.e.api.submit_ok(body or {"note_ids": self.notes[:2]}, client=self.client)
        self.accepted.append(job_id)
        return job_id

    def shift(self, job_id: str, sql: str) -> None:
        self.e.db.sql(f"UPDATE export_jobs SET {sql} WHERE id = %s", (job_id,))

    def settle(self) -> None:
        """Every export so far is finished: the next failpoint can only hit the next one."""
        for job_id in self.accepted:
            self.e.db.wait_terminal(job_id)

    def deliveries_over(self, job_id: str) -> bool:
        """No delivery of ``job_id`` can still come: none of its outbox events is unsent, and
        the broker holds no message on exports.fast, waiting or unacknowledged (kombu's Redis
        transport keeps a delivered, unacknowledged message in its ``unacked`` hash)."""
        unsent = self.e.db.sql(
            "SELECT count(*) AS n FROM export_outbox WHERE job_id = %s AND sent_at IS NULL",
            (job_id,),
        )
        if unsent[0]["n"]:
            return False
        broker = redis.Redis.from_url(self.e.broker_url)
        try:
            return broker.llen(FAST_QUEUE) == 0 and broker.hlen("unacked") == 0
        finally:
            broker.close()

    def run(self) -> dict[str, int]:
        for _ in range(10):
            self.submit()
        self.submit({"all": True, "format": "markdown_zip"})
        self.settle()
        faults.arm(self.fault_file, "render.chunk", "io", times=1)
        assert self.e.db.wait_terminal(self.submit())["attempts"] == 2
        faults.arm(self.fault_file, "render.chunk", "permanent", times=1)
        assert self.e.db.wait_terminal(self.submit())["status"] == "failed"
        # a lease recovery: the worker child dies holding the lease
        faults.arm(self.fault_file, "render.chunk", "sleep:120", times=1)
        stalled = self.submit()
        wait_for(lambda: faults.remaining(self.fault_file, "render.chunk") == 0, what="stall")
        for pid in self.e.stack.procs["fast-worker"].children():
            os.kill(pid, signal.SIGKILL)
        self.shift(stalled, "lease_expires_at = now() - interval '1 second'")
        assert self.e.db.wait_terminal(stalled)["status"] == "succeeded"
        # The stalled job may have a second delivery: its first message, requeued when the
        # child was killed (reject_on_worker_lost), and the recovery's redispatch. Whichever
        # comes first runs it; a later one is refused. Wait until every delivery is over (the
        # stalled job's outbox events sent, nothing on exports.fast, nothing unacknowledged):
        # a claim on exports.fast takes the due jobs of the outbox beside its message, so a
        # late duplicate would take the lost job below from the outbox, and its dispatch would
        # never go through the failpoint. (Only one delivery happens when the requeued message
        # is claimed after the lease was moved: then no recovery redispatches.)
        wait_for(lambda: self.deliveries_over(stalled), what="the stalled job's deliveries over")
        # a lost dispatch: the delivery fails before the claim
        # armed for this job only (a late duplicate of the stalled job's message, requeued
        # when its child was killed, must not take the fault instead): the publisher is
        # paused from the submit to the arming, so no worker can see the job before
        publisher = self.e.stack.procs["publisher"]
        publisher.signal(signal.SIGSTOP)
        try:
            lost = self.submit()
            faults.arm(self.fault_file, "worker.before_claim", "db", times=1, only=lost)
        finally:
            publisher.signal(signal.SIGCONT)
        wait_for(lambda: faults.remaining(self.fault_file, "worker.before_claim") == 0, what="lost")
        wait_for(lambda: self.e.db.job(lost)["dispatch_count"] == 1, what="dispatch mark")
        self.shift(
            lost,
            "last_dispatched_at = now() - interval '2 minutes', created_at = now() - interval '2 minutes'",
        )
        assert self.e.db.wait_terminal(lost)["status"] == "succeeded"
        states = [self.e.db.wait_terminal(j)["status"] for j in self.accepted]
        return {s: states.count(s) for s in TERMINAL_STATES}


def test_dashboards_and_rules_work_on_a_real_prometheus(stack, prometheus: str) -> None:
    e, fault_file = stack
    with Receiver() as receiver:
        r = httpx.post(
            f"{e.stack.api_url}/v1/webhooks",
            json={"url": receiver.url},
            headers=e.api.auth,
            timeout=10,
        )
        assert r.status_code == 201, r.text
        outcome = Workload(e, fault_file).run()
        accepted = sum(outcome.values())
        # one message per finished export, delivered and counted across scrapes
        wait_for(
            lambda: (
                scalar(prometheus, 'sum(exports_webhook_deliveries_total{outcome="delivered"})')
                == accepted
            ),
            60,
            "delivered webhooks on the counter",
        )
    assert outcome == {"succeeded": accepted - 1, "failed": 1, "cancelled": 0}

    # Prometheus has scraped the final counters (summed over workers and children).
    wait_for(
        lambda: scalar(prometheus, 'sum(exports_submits_total{outcome="accepted"})') == accepted,
        60,
        "accepted submits on the counter",
    )
    wait_for(
        lambda: (
            scalar(prometheus, 'sum(exports_finishes_total{outcome="succeeded"})')
            == outcome["succeeded"]
        ),
        60,
        "succeeded finishes on the counter",
    )
    assert scalar(prometheus, "sum(exports_dead_letters_total)") == 1
    assert scalar(prometheus, "sum(exports_retries_total)") == 1
    for kind in ("lease_expiry", "lost_dispatch"):
        expr = f'sum(exports_recovery_seconds_count{{kind="{kind}"}})'
        wait_for(lambda expr=expr: scalar(prometheus, expr) == 1, 30, f"{expr} == 1")
    assert scalar(prometheus, 'max(exports_jobs{status="succeeded"})') >= 1

    # a dispatch pause in force, so that the pause panels have their series: the bulk queue,
    # which has nothing left to send (every export above is finished), paused by an operator
    pauses = f"{e.stack.api_url}/v1/admin/queues/exports.bulk"
    r = httpx.post(
        f"{pauses}/pause", json={"reason": "dashboards"}, headers=e.api.admin, timeout=10
    )
    assert r.status_code == 201, r.text
    try:
        wait_for(
            lambda: query(prometheus, 'exports_dispatch_paused_seconds{queue="exports.bulk"}'),
            60,
            "the pause's gauge scraped",
        )
        wait_scrapes(prometheus, 3)  # rates and increases need samples after the last change
        empty = [
            (board, panel, expr)
            for board, panel, expr in dashboard_expressions({"__rate_interval": "5m"})
            if not query(prometheus, expr)
        ]
    finally:
        r = httpx.post(
            f"{pauses}/resume", json={"reason": "dashboards"}, headers=e.api.admin, timeout=10
        )
        assert r.status_code == 200, r.text
    assert empty == [], f"dashboard queries without data: {empty}"

    for _, expr in rule_expressions(inline_records=True):
        query(prometheus, expr)  # parses and evaluates (alerts are quiet when healthy)
    rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
    evaluated = [r for g in rules for r in g["rules"]]
    assert evaluated and all(r["health"] == "ok" for r in evaluated), [
        (r["name"], r.get("lastError")) for r in evaluated if r["health"] != "ok"
    ]
    assert {r["name"] for r in evaluated} >= {name for name, _ in rule_expressions()}
