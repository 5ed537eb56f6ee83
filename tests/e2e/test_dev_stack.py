"""`make dev`'s script (scripts/dev.sh) on real servers:

- it brings the whole stack up, serves an export signed with a key it generated under
  DEV_HOME (``exportctl verify`` passes against the API's keys), and a stop signal stops everything it
  started, servers included, even when the TERM comes twice as it does under `make` (the
  process group's, then make's own forward);
- a stop is warm: an export in flight finishes (only each worker's main process gets TERM),
  with no lost attempt and no ``WorkerLostError``, and it is a clean exit even when the
  script started with SIGINT ignored (its trap cannot fire then);
- a second stack on the same DEV_HOME refuses, naming the first; a second stack beside it
  (its own DEV_HOME and ports) runs, and stopping it leaves the first one working.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import psycopg
import pytest

from devtools.api_client import bearer
from devtools.drills.harness import pid_alive
from devtools.stack import ROOT, free_port
from exportcore import faults
from tests.support import wait_for

pytestmark = pytest.mark.e2e

# Settings a developer's shell may carry that would point the script at other servers.
FOREIGN = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "ARTIFACT_URL",
    "ARTIFACT_DIR",
    "DEV_S3",
    "MANIFEST_SIGNING_KEY",
)
METRICS = ("API", "PUBLISHER", "SCANNER", "BEAT", "FAST_WORKER", "BULK_WORKER", "WEBHOOK")


def sigint(disposition: signal.Handlers) -> Callable[[], None]:
    """A ``preexec_fn`` that gives the script SIGINT (and SIGQUIT) with ``disposition``:
    the test decides, not how the suite itself was started (from a background job of a
    non-interactive shell both arrive ignored, and bash cannot trap a signal ignored on
    entry)."""

    def set_in_child() -> None:
        signal.signal(signal.SIGINT, disposition)
        signal.signal(signal.SIGQUIT, disposition)

    return set_in_child


class DevStack:
    """One run of scripts/dev.sh in its own process group, its output in ``log``; SIGINT
    restored to its default on entry (``sigint_ignored``: ignored, as in a background job)."""

    def __init__(
        self, home: Path, notes: Path, log: Path, *, sigint_ignored: bool = False, **extra: str
    ) -> None:
        self.home, self.log = home, log
        self.api_port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in FOREIGN}
        env.update(
            DEV_HOME=str(home),
            DEV_PG_PORT=str(free_port()),
            DEV_REDIS_PORT=str(free_port()),
            API_PORT=str(self.api_port),
            NOTES_DIR=str(notes),
            PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
            **{f"{name}_METRICS_PORT": str(free_port()) for name in METRICS},
        )
        env.update(extra)
        self.env = env
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                ["bash", "scripts/dev.sh"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=sigint(signal.SIG_IGN if sigint_ignored else signal.SIG_DFL),
            )

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> dict[str, str]:
        """The env file's variables once the stack is ready."""
        wait_for(
            lambda: (self.home / "env").exists() or self.proc.poll() is not None, 240, "the stack"
        )
        assert self.proc.poll() is None, self.output()[-3000:]
        return dict(
            line.removeprefix("export ").split("=", 1)
            for line in (self.home / "env").read_text().splitlines()
        )

    def auth(self) -> dict[str, str]:
        env = dict(
            line.removeprefix("export ").split("=", 1)
            for line in (self.home / "env").read_text().splitlines()
        )
        return bearer(env["API_KEY"])

    def export(self) -> str:
        created = httpx.post(
            f"{self.api}/v1/exports",
            json={"all": True, "format": "json"},
            headers=self.auth(),
            timeout=10,
        )
        assert created.status_code == 202, created.text
        return str(created.json()["id"])

    def status(self, job: str) -> dict[str, Any]:
        resp = httpx.get(f"{self.api}/v1/exports/{job}", headers=self.auth(), timeout=10)
        result: dict[str, Any] = resp.json()
        return result

    def server_pids(self) -> tuple[int, int]:
        pg = int((self.home / "pg" / "data" / "postmaster.pid").read_text().split()[0])
        return pg, int((self.home / "redis" / "redis.pid").read_text().strip())

    def stop(self, signum: int = signal.SIGINT, timeout: float = 120) -> int:
        os.killpg(self.proc.pid, signum)  # Ctrl-C or a TERM reaches the whole process group
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the script's process group, then whatever it started in sessions of its
        own (the Procfile's processes, the servers) that a failed test left behind: every
        process whose environment names this stack's DEV_HOME. A failing test must not
        leave servers holding ports for the rest of the suite."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        marker = f"DEV_HOME={self.home}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue  # gone meanwhile, or not ours to read


def _cleanup(home: Path) -> None:
    # a failed test must not leave its servers behind either
    subprocess.run(["bash", "scripts/localstack.sh", "stop-home", str(home)], cwd=ROOT)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def homes() -> Iterator[list[Path]]:
    made = [ROOT / ".test" / f"dev-{uuid4().hex[:8]}" for _ in range(2)]  # postgres reaches it
    yield made
    for home in made:
        _cleanup(home)


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "groceries.md").write_text("# Groceries\n\nmilk, bread\n")
    return folder


@pytest.mark.parametrize("stop", ["TERM", "INT"])
def test_dev_script_serves_an_export_and_a_stop_leaves_nothing_running(
    homes: list[Path], notes: Path, tmp_path: Path, stop: str
) -> None:
    stack = DevStack(homes[0], notes, tmp_path / "dev.log")
    try:
        stack.wait_ready()
        job = stack.export()
        wait_for(lambda: stack.status(job)["status"] == "succeeded", 60, "the export to succeed")
        body = httpx.get(f"{stack.api}/v1/exports/{job}/download", headers=stack.auth(), timeout=10)
        assert body.status_code == 200 and "milk, bread" in body.text
        # signed by default, with a key generated once under DEV_HOME
        assert (homes[0] / "manifest-signing.key").stat().st_mode & 0o077 == 0
        saved = tmp_path / "export.json"
        saved.write_bytes(body.content)
        checked = subprocess.run(
            [str(Path(sys.executable).parent / "exportctl"), "verify", str(saved)],
            env={**stack.env, "API_URL": stack.api},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert checked.returncode == 0, checked.stderr
        assert "verified export" in checked.stderr
        # webhooks work out of the box: the secret is encrypted with the key make dev keeps
        hook = httpx.post(
            f"{stack.api}/v1/webhooks",
            json={"url": "http://127.0.0.1:9/hook"},
            headers=stack.auth(),
            timeout=10,
        )
        assert hook.status_code == 201, hook.text
        assert "DEV_WEBHOOK_KEY=" in (homes[0] / "keys").read_text()
        pg_pid, redis_pid = stack.server_pids()
        if stop == "TERM":
            os.killpg(stack.proc.pid, signal.SIGTERM)
            os.kill(stack.proc.pid, signal.SIGTERM)  # ... and make forwards its TERM too
            assert stack.proc.wait(120) == 0, stack.output()[-3000:]
        else:
            assert stack.stop(signal.SIGINT) == 0, stack.output()[-3000:]
    finally:
        stack.kill()
    output = stack.output()
    assert output.rstrip().endswith("stopped"), output[-2000:]
    # the servers were told to stop before the script exited; they finish exiting on their own
    wait_for(
        lambda: not pid_alive(pg_pid) and not pid_alive(redis_pid),
        10,
        "PostgreSQL and Redis to exit",
    )
    assert not (homes[0] / "env").exists() and not (homes[0] / "stack.pid").exists()
    # the banner names the env file of this DEV_HOME
    banner = output.index("notes-exports is running")
    assert f"source {homes[0].relative_to(ROOT)}/env" in output[banner:]


def recipe(marker: str = "failpoint recipe") -> list[str]:
    """The lines of the shell block that follows ``marker`` in docs/development.md."""
    text = (ROOT / "docs" / "development.md").read_text()
    block = text[text.index(marker) :].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_documented_failpoint_recipe_fails_the_next_export_for_a_replay(
    homes: list[Path], notes: Path, tmp_path: Path
) -> None:
    """docs/development.md's one line, run as written in a shell that sourced the stack's
    env file, fails the next export for good: it is dead-lettered (injected_permanent), and
    its replay, the failpoint spent, succeeds."""
    lines = recipe()
    assert lines[0] == "source .dev/env" and "$EXPORTS_FAULTS_FILE" in lines[1]
    stack = DevStack(homes[0], notes, tmp_path / "dev.log")
    try:
        env_file = stack.wait_ready()
        assert env_file["EXPORTS_FAULTS_FILE"] == str(homes[0] / "faults.json")
        assert (homes[0] / "faults.json").read_text() == ""  # nothing armed at start
        exe = Path(sys.executable).parent / "exportctl"
        script = "\n".join(
            [
                f"source {homes[0]}/env",
                lines[1],
                f"ID=$({exe} submit --all)",
                f'{exe} watch "$ID" --timeout 120 >/dev/null; echo "watch=$?"',
                f"{exe} dead-letters list --output jsonl",
                f'{exe} replay "$ID" >"{tmp_path}/replay"',
                'echo "id=$ID"',
            ]
        )
        ran = subprocess.run(
            ["bash", "-c", script],
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        job = ran.stdout.split("id=")[1].strip()
        assert "watch=3" in ran.stdout, ran.stdout + ran.stderr[-2000:]
        failed = stack.status(job)
        assert failed["status"] == "failed" and failed["error"]["code"] == "injected_permanent"
        assert f'"job_id":"{job}"' in ran.stdout  # its dead letter is listed
        assert faults.remaining(homes[0] / "faults.json", "render.chunk") == 0
        replay = (tmp_path / "replay").read_text().strip()
        wait_for(lambda: stack.status(replay)["status"] == "succeeded", 120, "the replay")
        assert stack.status(replay)["replay_of"] == job
    finally:
        stack.kill()


def test_stopping_the_stack_lets_an_export_in_flight_finish(
    homes: list[Path], notes: Path, tmp_path: Path, database_url: str, broker_url: str
) -> None:
    """Warm shutdown: the export runs (stalled in render.chunk) when Ctrl-C arrives; it
    finishes in the same attempt before the stack exits, and nothing is lost. The script
    starts with SIGINT ignored, so its trap cannot fire: the clean stop (exit 0) comes from
    the supervisor's own warm stop, not from the trap."""
    faults_file = tmp_path / "faults.json"
    faults.arm(faults_file, "render.chunk", "sleep:6")
    stack = DevStack(
        homes[0],
        notes,
        tmp_path / "dev.log",
        # the test's own servers, which outlive the stack, so the job can be read afterwards
        DATABASE_URL=database_url,
        CELERY_BROKER_URL=broker_url,
        EXPORTS_FAULTS_FILE=str(faults_file),
        DEV_STOP_GRACE="60",
        sigint_ignored=True,
    )
    try:
        stack.wait_ready()
        job = stack.export()
        wait_for(lambda: faults.hits(faults_file, "render.chunk"), 60, "the export to render")
        assert stack.status(job)["status"] == "running"
        assert stack.stop(signal.SIGINT) == 0, stack.output()[-3000:]
    finally:
        stack.kill()
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT status, attempts FROM export_jobs WHERE id = %s", (job,)
        ).fetchone()
    output = stack.output()
    assert row == ("succeeded", 1), output[-3000:]
    assert "WorkerLostError" not in output
    assert "Worker exited prematurely" not in output


def test_a_second_stack_refuses_the_same_dev_home_and_runs_beside_with_its_own(
    homes: list[Path], notes: Path, tmp_path: Path
) -> None:
    first = DevStack(homes[0], notes, tmp_path / "first.log")
    second: DevStack | None = None
    try:
        first.wait_ready()
        pg_pid, redis_pid = first.server_pids()
        # Same DEV_HOME (only API_PORT moved, as people try first): refused, naming the first.
        same = DevStack(homes[0], notes, tmp_path / "same.log")
        assert same.proc.wait(60) == 1
        said = same.output()
        assert f"pid {first.proc.pid}" in said and first.api in said, said
        assert "DEV_HOME=" in said and "make dev" in said  # how to run one beside it
        # Its own DEV_HOME, but the first stack's api port: refused before starting anything.
        clash = DevStack(homes[1], notes, tmp_path / "clash.log", API_PORT=str(first.api_port))
        assert clash.proc.wait(60) == 1
        assert f"port {first.api_port} (API_PORT" in clash.output()
        shutil.rmtree(homes[1], ignore_errors=True)
        # Fully beside it: its own DEV_HOME and ports. Both serve; stopping it leaves the first.
        second = DevStack(homes[1], notes, tmp_path / "second.log")
        second.wait_ready()
        job = second.export()
        wait_for(lambda: second.status(job)["status"] == "succeeded", 60, "the second's export")
        assert second.stop(signal.SIGINT) == 0, second.output()[-3000:]
        assert pid_alive(pg_pid) and pid_alive(redis_pid)
        job = first.export()
        wait_for(lambda: first.status(job)["status"] == "succeeded", 60, "the first's export")
        assert first.stop(signal.SIGINT) == 0, first.output()[-3000:]
    finally:
        first.kill()
        if second is not None:
            second.kill()
