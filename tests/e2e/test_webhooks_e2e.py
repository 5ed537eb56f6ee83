"""Webhooks end to end with the Procfile's real processes: registered with the CLI, every
finished export reaches a real receiver signed and verified; a SIGKILL of the
webhook-delivery process while attempts are in flight loses nothing (the messages it held
are sent again, with the same webhook-id, after their claims expire)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.webhook_receiver import Answer, Receiver
from exportcore.webhooks.events import webhook_id
from tests.e2e.conftest import E2E, FAST_RECOVERY_ENV, exportctl, running_stack
from tests.support import wait_for

EXPORTCTL = str(Path(sys.executable).parent / "exportctl")

pytestmark = pytest.mark.e2e

HELD = 3  # requests the receiver holds while the delivery process is killed


@pytest.fixture(scope="module")
def webhook_stack(servers, template_db, notes_dir, tmp_path_factory) -> Iterator[E2E]:
    env = {
        **FAST_RECOVERY_ENV,
        "WEBHOOK_ALLOW_HTTP": "true",
        "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true",
        "WEBHOOK_TIMEOUT_SECONDS": "20",
        "WEBHOOK_CLAIM_SECONDS": "25",
        "WEBHOOK_POLL_SECONDS": "0.2",
    }
    names = ("api", "publisher", "recovery-scanner", "fast-worker", "webhook-delivery")
    with running_stack(
        servers, template_db, notes_dir, tmp_path_factory.mktemp("webhooks"), env, names
    ) as e:
        yield e


def _messages(e: E2E) -> list[dict[str, Any]]:
    with e.db.connect() as conn:
        return conn.execute("SELECT * FROM webhook_messages ORDER BY created_at").fetchall()


def test_registered_with_the_cli_and_nothing_lost_when_the_sender_is_killed(
    webhook_stack: E2E,
) -> None:
    e = webhook_stack
    release = threading.Event()
    held: list[int] = []

    def respond(n: int, headers: dict[str, str]) -> Answer:
        if n < HELD:  # the first attempts stay in flight until the process was killed
            held.append(n)
            release.wait(60)
        return Answer(status=200)

    cli = {**e.stack.env, "API_URL": e.stack.api_url, "API_KEY": e.api.api_key, "COLUMNS": "200"}
    with Receiver(respond=respond) as receiver:
        created = exportctl(
            cli, "webhook", "create", receiver.url + "/hook", "--event", "export.succeeded"
        )
        endpoint_id, secret = created.strip().splitlines()[-2:]
        receiver.secrets = [secret]
        assert endpoint_id in exportctl(cli, "webhook", "list")

        ids = e.note_ids(2)
        jobs = [e.api.submit_ok({"note_ids": ids}) for _ in range(6)]
        for job in jobs:
            assert e.db.wait_terminal(job)["status"] == "succeeded"
        wait_for(lambda: len(held) == HELD, 30, "attempts held in flight by the receiver")
        sender = e.stack.procs["webhook-delivery"]
        sender.signal(signal.SIGKILL)
        assert sender.wait(10) == -signal.SIGKILL
        release.set()  # their answers now go to a dead process
        e.stack.restart("webhook-delivery")
        wait_for(
            lambda: (m := _messages(e)) and all(x["status"] == "delivered" for x in m) and m,
            90,
            "every message delivered after the restart",
        )
        received = list(receiver.received)
        test_out = exportctl(cli, "webhook", "test", endpoint_id, "--wait", "30")
        deliveries = exportctl(cli, "webhook", "deliveries", endpoint_id, "--limit", "50")
        everything = json.loads(
            exportctl(cli, "webhook", "deliveries", endpoint_id, "--limit", "50", "--json")
        )
        first = subprocess.run(
            [EXPORTCTL, "webhook", "deliveries", endpoint_id, "--limit", "2", "--json"],
            env=cli,
            capture_output=True,
            text=True,
            check=True,
        )
        cursor = first.stderr.split("more: --cursor", 1)[1].split()[0]
        rest = exportctl(cli, "webhook", "deliveries", endpoint_id, "--cursor", cursor, "--json")
        paged = [a["id"] for a in json.loads(first.stdout) + json.loads(rest)]
        assert paged == [a["id"] for a in everything][: len(paged)] and len(paged) > 2

    messages = [m for m in _messages(e) if m["event_type"] == "export.succeeded"]
    assert len(messages) == len(jobs)  # one per export (and the test message)
    got: dict[str, set[str]] = {}
    for r in received:
        assert r.verified_by == (0,), "every request verifies with the endpoint's secret"
        got.setdefault(r.payload["data"]["export"]["id"], set()).add(r.webhook_id)
    assert set(got) == set(jobs), "every finished export reached the receiver at least once"
    assert all(len(ids_) == 1 for ids_ in got.values()), "one webhook-id per event"
    ids_seen = [r.webhook_id for r in received]
    resent = {i for i in ids_seen if ids_seen.count(i) > 1}
    assert len(resent) >= 1, "the messages in flight at the kill were sent again"
    assert resent <= {webhook_id(m["id"]) for m in messages}
    assert "delivered" in test_out
    assert "export.succeeded" in deliveries and "delivered" in deliveries
    metrics = httpx.get(e.stack.metrics_url("webhook-delivery"), timeout=10).text
    assert "exports_webhook_gauges_up 1.0" in metrics
    assert "exports_webhook_messages_pending 0.0" in metrics
    assert (
        'exports_webhook_deliveries_total{event_type="export.succeeded",outcome="delivered"}'
        in metrics
    )
    log = e.stack.procs["webhook-delivery"].log_text()
    assert secret not in log and receiver.url + "/hook" not in log
