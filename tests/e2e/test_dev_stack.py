"""`make dev`'s script (scripts/dev.sh) on real servers: it brings the whole stack up, serves
an export, and a stop signal stops everything it started, servers included, even when the
TERM comes twice as it does under `make` (the process group's, then make's own forward)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import httpx
import pytest

from devtools.drills.harness import pid_alive
from devtools.stack import ROOT, free_port
from tests.support import wait_for

# Settings a developer's shell may carry that would point the script at other servers.
FOREIGN = ("DATABASE_URL", "CELERY_BROKER_URL", "ARTIFACT_URL", "ARTIFACT_DIR", "DEV_S3")


@pytest.fixture
def dev_home() -> Iterator[Path]:
    home = ROOT / ".test" / f"dev-{uuid4().hex[:8]}"  # the postgres user must reach it
    yield home
    # a failed test must not leave its servers behind either
    subprocess.run(["bash", "scripts/localstack.sh", "pg-stop", str(home / "pg")], cwd=ROOT)
    pidfile = home / "redis" / "redis.pid"
    if pidfile.exists() and pid_alive(pid := int(pidfile.read_text().strip())):
        os.kill(pid, signal.SIGTERM)
    shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("stop", ["TERM", "INT"])
def test_dev_script_serves_an_export_and_a_stop_leaves_nothing_running(
    dev_home: Path, tmp_path: Path, stop: str
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "groceries.md").write_text("# Groceries\n\nmilk, bread\n")
    api_port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN}
    env.update(
        DEV_HOME=str(dev_home),
        DEV_PG_PORT=str(free_port()),
        DEV_REDIS_PORT=str(free_port()),
        API_PORT=str(api_port),
        NOTES_DIR=str(notes),
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
        **{
            f"{name}_METRICS_PORT": str(free_port())
            for name in ("PUBLISHER", "SCANNER", "BEAT", "FAST_WORKER", "BULK_WORKER", "WEBHOOK")
        },
    )
    log = tmp_path / "dev.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "scripts/dev.sh"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: (dev_home / "env").exists() or proc.poll() is not None, 240, "the stack")
        assert proc.poll() is None, log.read_text()[-3000:]
        dev_env = dict(
            line.removeprefix("export ").split("=", 1)
            for line in (dev_home / "env").read_text().splitlines()
        )
        api = f"http://127.0.0.1:{api_port}"
        auth = {"Authorization": f"Bearer {dev_env['API_KEY']}"}
        created = httpx.post(
            f"{api}/v1/exports", json={"all": True, "format": "json"}, headers=auth, timeout=10
        )
        assert created.status_code == 202, created.text
        job = created.json()["id"]
        wait_for(
            lambda: (
                httpx.get(f"{api}/v1/exports/{job}", headers=auth, timeout=10).json()["status"]
                == "succeeded"
            ),
            60,
            "the export to succeed",
        )
        body = httpx.get(f"{api}/v1/exports/{job}/download", headers=auth, timeout=10)
        assert body.status_code == 200 and "milk, bread" in body.text
        pg_pid = int((dev_home / "pg" / "data" / "postmaster.pid").read_text().split()[0])
        redis_pid = int((dev_home / "redis" / "redis.pid").read_text().strip())

        signum = getattr(signal, f"SIG{stop}")
        os.killpg(proc.pid, signum)  # Ctrl-C or a TERM reaches the whole process group
        if stop == "TERM":
            os.kill(proc.pid, signal.SIGTERM)  # ... and make forwards its TERM to the recipe
        assert proc.wait(90) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    output = log.read_text()
    assert output.rstrip().endswith("stopped"), output[-2000:]
    # the servers were told to stop before the script exited; they finish exiting on their own
    wait_for(
        lambda: not pid_alive(pg_pid) and not pid_alive(redis_pid),
        10,
        "PostgreSQL and Redis to exit",
    )
    assert not (dev_home / "env").exists()
