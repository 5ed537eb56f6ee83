"""Operations on the real processes (gunicorn api with several workers, publisher,
recovery-scanner, both Celery workers): replay races over HTTP, the operator commands of
``exportctl`` through the admin API, and the broker as a running worker leaves it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest

from exportcore import faults
from exportctl.exits import EXIT_UNAUTHORISED
from tests.e2e.conftest import E2E, failpoint_stack
from tests.support import wait_for

pytestmark = pytest.mark.e2e

EXPORTCTL = str(Path(sys.executable).parent / "exportctl")


@pytest.fixture(scope="module")
def ops(servers, template_db, notes_dir, tmp_path_factory) -> Iterator[tuple[E2E, Path]]:
    base = tmp_path_factory.mktemp("ops")
    env = {"BROKER_METRICS_INTERVAL_SECONDS": "0.5"}
    with failpoint_stack(servers, template_db, notes_dir, base, env) as stack:
        yield stack


def failed_export(e: E2E, fault_file: Path) -> str:
    """An export that failed permanently on the real worker (a dead letter)."""
    faults.arm(fault_file, "render.chunk", "permanent", times=1)
    r = httpx.post(
        f"{e.stack.api_url}/v1/exports", json={"note_ids": e.note_ids(2)}, headers=e.api.auth
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert e.db.wait_terminal(job_id, 30)["status"] == "failed"
    return str(job_id)


def replays_of(e: E2E, job_id: str) -> list[dict[str, Any]]:
    with e.db.connect() as conn:
        return conn.execute(
            "SELECT id, status, replay_of FROM export_jobs WHERE replay_of = %s", (job_id,)
        ).fetchall()


def exportctl(e: E2E, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**e.stack.env, "API_URL": e.stack.api_url, "COLUMNS": "200"}
    env.pop("API_KEY", None)
    env["OPERATOR_KEY"] = e.api.admin_key if key is None else key
    return subprocess.run([EXPORTCTL, *args], env=env, capture_output=True, text=True)


def test_ten_parallel_replays_over_http_create_one_job(ops) -> None:
    e, fault_file = ops
    original = failed_export(e, fault_file)
    barrier = threading.Barrier(10)
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def replay() -> None:
        with httpx.Client(timeout=30) as client:  # its own connection: spread over workers
            barrier.wait()
            r = client.post(
                f"{e.stack.api_url}/v1/admin/exports/{original}/replay", headers=e.api.admin
            )
        with lock:
            answers.append(r)

    threads = [threading.Thread(target=replay) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in answers) == [200] * 9 + [202], [
        (r.status_code, r.text) for r in answers
    ]
    assert len({r.json()["id"] for r in answers}) == 1
    assert all(
        r.headers.get("idempotent-replayed") == "true" for r in answers if r.status_code == 200
    )
    [replay_row] = replays_of(e, original)
    assert str(replay_row["id"]) == answers[0].json()["id"]
    assert e.db.wait_terminal(replay_row["id"], 30)["status"] == "succeeded"
    # replaying after the success answers with it, and still writes nothing
    again = httpx.post(f"{e.stack.api_url}/v1/admin/exports/{original}/replay", headers=e.api.admin)
    assert again.status_code == 200 and again.json()["id"] == str(replay_row["id"])
    assert len(replays_of(e, original)) == 1
    # the tenant's own key cannot replay at all (not even its own export)
    mine = httpx.post(f"{e.stack.api_url}/v1/admin/exports/{original}/replay", headers=e.api.auth)
    assert mine.status_code == 403


def test_a_failed_replay_chains_over_http(ops) -> None:
    e, fault_file = ops
    original = failed_export(e, fault_file)
    faults.arm(fault_file, "render.chunk", "permanent", times=1)
    first = httpx.post(f"{e.stack.api_url}/v1/admin/exports/{original}/replay", headers=e.api.admin)
    assert first.status_code == 202
    assert e.db.wait_terminal(first.json()["id"], 30)["status"] == "failed"
    second = httpx.post(
        f"{e.stack.api_url}/v1/admin/exports/{original}/replay", headers=e.api.admin
    )
    assert second.status_code == 202 and second.json()["replay_of"] == first.json()["id"]
    done = e.db.wait_terminal(second.json()["id"], 30)
    assert done["status"] == "succeeded" and done["replay_of"] == UUID(first.json()["id"])


def test_exportctl_operator_commands_go_through_the_admin_api(ops) -> None:
    e, fault_file = ops
    failed = [failed_export(e, fault_file) for _ in range(4)]
    listing = exportctl(e, "dead-letters", "list", "--state", "open", "--json")
    assert listing.returncode == 0, listing.stderr
    open_ids = [d["job_id"] for d in json.loads(listing.stdout)]
    assert set(failed) <= set(open_ids)
    # the kind of the key governs the CLI as it governs HTTP: a tenant key is refused
    tenant = exportctl(e, "dead-letters", "list", key=e.api.api_key)
    assert (
        tenant.returncode == EXIT_UNAUTHORISED
        and "HTTP 403" in tenant.stderr
        and "operator key" in tenant.stderr
    )
    assert exportctl(e, "replay", failed[0], key=e.api.api_key).returncode == EXIT_UNAUTHORISED

    one = exportctl(e, "replay", failed[0])
    assert one.returncode == 0, one.stderr
    replay_id = one.stdout.strip()
    assert "replay accepted" in one.stderr
    again = exportctl(e, "replay", failed[0])
    assert again.returncode == 0 and again.stdout.strip() == replay_id
    assert "already replayed" in again.stderr
    # a corrected input: a new snapshot of other notes, as ndjson, still replay_of the original
    fixable = failed_export(e, fault_file)
    picked = [str(i) for i in e.note_ids(3)[1:]]
    corrected = exportctl(
        e, "replay", fixable, "--format", "ndjson", "--note-id", picked[0], "--note-id", picked[1]
    )
    assert corrected.returncode == 0, corrected.stderr
    with e.db.connect() as conn:
        row = conn.execute(
            "SELECT replay_of, format, payload FROM export_jobs WHERE id = %s",
            (corrected.stdout.strip(),),
        ).fetchone()
    assert row["replay_of"] == UUID(fixable) and row["format"] == "ndjson"
    assert row["payload"]["selection"] == {"note_ids": sorted(int(i) for i in picked)}
    # done before the tests below arm their failpoints
    assert e.db.wait_terminal(corrected.stdout.strip(), 60)["status"] == "succeeded"

    dl_ids = {
        d["job_id"]: d["id"]
        for d in json.loads(exportctl(e, "dead-letters", "list", "--json").stdout)
    }
    resolved = exportctl(
        e, "dead-letters", "resolve", str(dl_ids[failed[1]]), "--note", "told the customer"
    )
    assert resolved.returncode == 0 and "resolved by nex_op_" in resolved.stderr
    twice = exportctl(e, "dead-letters", "resolve", str(dl_ids[failed[1]]))
    assert twice.returncode == 1 and "HTTP 409" in twice.stderr

    # two bulk replays at once, as two operators would: one replay per open dead letter
    env = {**e.stack.env, "API_URL": e.stack.api_url, "OPERATOR_KEY": e.api.admin_key}
    env.pop("API_KEY", None)
    runs = [
        subprocess.Popen(
            [EXPORTCTL, "dead-letters", "replay-all", "--reason", "injected_permanent", "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = []
    for p in runs:
        stdout, stderr = p.communicate(timeout=60)
        assert p.returncode == 0, stderr
        results.append(json.loads(stdout))
    created = [i["job_id"] for r in results for i in r["created"]]
    assert failed[2] in created and failed[3] in created
    assert len(created) == len(set(created))  # never twice
    for job_id in failed:
        assert len(replays_of(e, job_id)) == (0 if job_id == failed[1] else 1), job_id
    rerun = exportctl(e, "dead-letters", "replay-all", "--reason", "injected_permanent")
    assert rerun.returncode == 0 and "0 replayed" in rerun.stderr
    states = json.loads(exportctl(e, "dead-letters", "list", "--json").stdout)
    by_job = {d["job_id"]: d for d in states}
    assert by_job[failed[1]]["state"] == "resolved"
    assert by_job[failed[1]]["resolution_note"] == "told the customer"
    assert all(by_job[j]["state"] == "replayed" for j in (failed[0], failed[2], failed[3]))


def test_exportctl_with_a_viewer_key_reads_and_each_change_exits_not_authorised(ops) -> None:
    e, fault_file = ops
    bad = failed_export(e, fault_file)
    made = exportctl(e, "operator-key", "create", "--label", "vera", "--role", "viewer", "-q")
    assert made.returncode == 0, made.stderr
    viewer = made.stdout.strip()
    # a viewer reads through the admin API like any operator
    listing = exportctl(e, "dead-letters", "list", "--state", "open", "--json", key=viewer)
    assert listing.returncode == 0, listing.stderr
    [letter] = [d for d in json.loads(listing.stdout) if d["job_id"] == bad]
    with e.db.connect() as conn:
        audited = conn.execute("SELECT count(*) AS n FROM operator_actions").fetchone()["n"]
    # ... and every change it asks for is refused by the server: exit 6, said on stderr
    for args in (
        ("replay", bad),
        ("dead-letters", "resolve", str(letter["id"]), "--note", "seen"),
        ("bulk", "replay", "--reason", "injected_permanent", "--yes"),
    ):
        refused = exportctl(e, *args, key=viewer)
        assert refused.returncode == EXIT_UNAUTHORISED, (args, refused.stderr)
        told = refused.stderr
        assert "error: HTTP 403" in told and "is a viewer key" in told, (args, told)
        assert "needs an admin operator key" in told and "set-role" in told, (args, told)
        assert refused.stdout == "" and "Traceback" not in told, args
    assert replays_of(e, bad) == []
    with e.db.connect() as conn:
        state = conn.execute(
            "SELECT state FROM export_dead_letters WHERE id = %s", (letter["id"],)
        ).fetchone()["state"]
        after = conn.execute("SELECT count(*) AS n FROM operator_actions").fetchone()["n"]
        runs = conn.execute(
            "SELECT count(*) AS n FROM bulk_actions WHERE actor LIKE %s", ("%(vera)",)
        ).fetchone()["n"]
    assert (state, after, runs) == ("open", audited, 0)


def test_exportctl_queue_pause_status_and_resume_through_the_admin_api(ops) -> None:
    """``exportctl queue``: a pause of exports.bulk holds a bulk export in the outbox while
    small exports run; ``status`` shows it with its reason and what waits; a second pause,
    a viewer's pause and a resume of what is not paused are refused with a message that
    says why; the resume sends the export, which succeeds."""
    e, _ = ops
    paused = exportctl(e, "queue", "pause", "exports.bulk", "--reason", "disk replacement")
    assert paused.returncode == 0, paused.stderr
    assert "dispatch of exports.bulk paused" in paused.stderr
    bulk = e.api.submit_ok({"all": True})
    small = e.api.submit_ok({"note_ids": e.note_ids(1)})
    assert e.db.wait_terminal(small, 60)["status"] == "succeeded"
    assert e.db.scalar("SELECT status FROM export_jobs WHERE id = %s", (bulk,)) == "queued"

    status = exportctl(e, "queue", "status")
    assert status.returncode == 0, status.stderr
    lines = {
        line.split()[0]: line for line in status.stdout.splitlines() if line.startswith("exports.")
    }
    assert "PAUSED" in lines["exports.bulk"] and "disk replacement" in lines["exports.bulk"]
    assert "flowing" in lines["exports.fast"]
    as_json = json.loads(exportctl(e, "queue", "status", "--json").stdout)
    [bulk_row] = [r for r in as_json if r["queue"] == "exports.bulk"]
    assert bulk_row["paused"] and bulk_row["waiting"] == 1 and bulk_row["tenant"] is None

    # the tenant's own `exportctl status` says why its export waits (not who paused, or why)
    env = {**e.stack.env, "API_URL": e.stack.api_url, "API_KEY": e.api.api_key, "COLUMNS": "200"}
    env.pop("OPERATOR_KEY", None)
    mine = subprocess.run([EXPORTCTL, "status", bulk], env=env, capture_output=True, text=True)
    assert mine.returncode == 0, mine.stderr
    assert "paused by an operator" in mine.stdout and "disk replacement" not in mine.stdout

    again = exportctl(e, "queue", "pause", "exports.bulk", "--reason", "again")
    assert (
        again.returncode == 1
        and "was paused by" in again.stderr
        and "disk replacement" in again.stderr
    )
    made = exportctl(e, "operator-key", "create", "--label", "val", "--role", "viewer", "-q")
    viewer = made.stdout.strip()
    assert exportctl(e, "queue", "status", key=viewer).returncode == 0
    refused = exportctl(e, "queue", "resume", "exports.bulk", "--reason", "r", key=viewer)
    assert (
        refused.returncode == EXIT_UNAUTHORISED and "needs an admin operator key" in refused.stderr
    )
    unknown = exportctl(e, "queue", "pause", "exports.slow", "--reason", "r")
    assert unknown.returncode == 2 and "exports.fast, exports.bulk" in unknown.stderr
    blank = exportctl(e, "queue", "pause", "exports.fast", "--reason", " ")
    assert blank.returncode == 2 and "--reason" in blank.stderr
    not_paused = exportctl(e, "queue", "resume", "exports.fast", "--reason", "r")
    assert not_paused.returncode == 1 and "is not paused" in not_paused.stderr

    resumed = exportctl(e, "queue", "resume", "exports.bulk", "--reason", "disk replaced")
    assert resumed.returncode == 0 and "resumed after" in resumed.stderr, resumed.stderr
    assert e.db.wait_terminal(bulk, 120)["status"] == "succeeded"
    with e.db.connect() as conn:
        rows = conn.execute(
            "SELECT action, detail->>'reason' AS reason FROM operator_actions "
            "WHERE target_kind = 'queue' ORDER BY id"
        ).fetchall()
    assert [(r["action"], r["reason"]) for r in rows] == [
        ("queue_pause", "disk replacement"),
        ("queue_resume", "disk replaced"),
    ]


def unacked_gauge(url: str) -> float | None:
    """``exports_broker_messages{queue="exports.fast",state="unacked"}`` as scraped."""
    text = httpx.get(url, timeout=10).text
    m = re.search(r'exports_broker_messages\{queue="exports.fast",state="unacked"\} (\S+)', text)
    return float(m.group(1)) if m and "exports_broker_up 1.0" in text else None


def test_broker_inspect_sees_a_worker_holding_a_message(ops) -> None:
    e, fault_file = ops
    faults.arm(fault_file, "render.chunk", "sleep:8", times=1)
    r = httpx.post(
        f"{e.stack.api_url}/v1/exports", json={"note_ids": e.note_ids(1)}, headers=e.api.auth
    )
    job_id = r.json()["id"]
    wait_for(lambda: e.db.job(job_id)["status"] == "running", 30, "the worker holds the export")
    shown = exportctl(e, "broker", "inspect", "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    fast = report["queues"]["exports.fast"]
    assert fast["unacked"] >= 1 and fast["oldest_unacked_age"] is not None
    assert report["oldest_unacked_age"] >= fast["oldest_unacked_age"] > 0
    assert job_id not in [m["job_id"] for m in report["stale"] + report["unknown"]]
    assert report["lost"] == []
    url = e.stack.metrics_url("recovery-scanner")
    wait_for(lambda: (unacked_gauge(url) or 0) >= 1, 20, "the scanner's broker gauges")
    assert e.db.wait_terminal(job_id, 30)["status"] == "succeeded"
    after = json.loads(exportctl(e, "broker", "inspect", "--json").stdout)
    assert job_id not in [m["job_id"] for m in after["stale"]]  # acknowledged, not left
