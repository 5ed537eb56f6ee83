"""The chart's own commands really run.

The chart is rendered with the test PostgreSQL and Redis as its connection settings; for each
component the Deployment's container args, environment (ConfigMap + Secret + env, exactly as
rendered) and probes are taken from the YAML and run here: the args as the process, each
probe (HTTP or exec) until it passes. Then the preStop hook and TERM are applied to each
worker while it is in the middle of an export: the export still succeeds (Celery warm
shutdown) and the process exits within the rendered terminationGracePeriodSeconds.

Only the container's volumes are mapped to local folders (``/run/notes-exports``, the
artifact mount, ``/tmp`` as TMPDIR) and the listening address to a free loopback port.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import psycopg
import pytest

from devtools.stack import ROOT, ManagedProcess, Servers, free_port
from tests.chart.conftest import CHART, RELEASE, find, render

pytestmark = [pytest.mark.chart, pytest.mark.e2e]

# The components whose modules exist in this branch, by their key in values.yaml
# `components`. recoveryScanner and beat join with one entry each once their modules land.
COMPONENTS = ("api", "publisher", "recoveryScanner", "beat", "fastWorker", "bulkWorker")
WORKERS = {"fastWorker": "exports.fast", "bulkWorker": "exports.bulk"}
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
PREFIX = f"{RELEASE}-notes-exports"


def kebab(key: str) -> str:
    return "".join(f"-{ch.lower()}" if ch.isupper() else ch for ch in key)


@dataclass
class Component:
    """One Deployment of the rendered chart, running here."""

    key: str
    container: dict[str, Any]
    pod: dict[str, Any]
    env: dict[str, str]
    ports: dict[str, int] = field(default_factory=dict)  # port name -> local port
    proc: ManagedProcess | None = None

    @property
    def grace(self) -> int:
        return int(self.pod["terminationGracePeriodSeconds"])

    @property
    def process(self) -> ManagedProcess:
        assert self.proc is not None
        return self.proc


@dataclass
class Deployment:
    components: dict[str, Component]
    database_url: str
    api_key: str
    note_ids: list[int]

    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.components['api'].ports['http']}"


class Volumes:
    """Container mount paths -> local folders; the listening address -> a loopback port."""

    def __init__(self, base: Path, container: dict[str, Any], shared_artifacts: Path) -> None:
        self.paths: dict[str, Path] = {}
        for mount in container.get("volumeMounts", []):
            local = shared_artifacts if mount["name"] == "artifacts" else base / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            self.paths[mount["mountPath"]] = local
        self.ports = {
            p["name"]: (p["containerPort"], free_port()) for p in container.get("ports", [])
        }

    def map(self, value: str) -> str:
        for mount, local in sorted(self.paths.items(), key=lambda kv: -len(kv[0])):
            if value == mount or value.startswith(mount + "/"):
                return str(local) + value[len(mount) :]
        for container_port, local_port in self.ports.values():
            if value == f"0.0.0.0:{container_port}":
                return f"127.0.0.1:{local_port}"
        return value


def resolve_env(objs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The container's environment exactly as Kubernetes would build it from the render."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(find(objs, "ConfigMap", source["configMapRef"]["name"])["data"])
        else:
            secret = find(objs, "Secret", source["secretRef"]["name"])
            env.update({k: base64.b64decode(v).decode() for k, v in secret["data"].items()})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in item.get("valueFrom", {}):
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = base64.b64decode(
                find(objs, "Secret", ref["name"])["data"][ref["key"]]
            ).decode()
        elif "configMapKeyRef" in item.get("valueFrom", {}):
            ref = item["valueFrom"]["configMapKeyRef"]
            env[item["name"]] = find(objs, "ConfigMap", ref["name"])["data"][ref["key"]]
        else:
            raise AssertionError(f"unsupported env source {item}")
    return env


def run_exec(
    component: Component, command: list[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        env=component.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def probe_once(component: Component, probe: dict[str, Any]) -> tuple[bool, str]:
    timeout = float(probe.get("timeoutSeconds", 1))
    if "exec" in probe:
        proc = run_exec(component, probe["exec"]["command"], timeout)
        return proc.returncode == 0, (proc.stdout + proc.stderr).strip()
    if "httpGet" in probe:
        get = probe["httpGet"]
        port = get["port"]
        local = (
            component.ports[port]
            if isinstance(port, str)
            else next(lp for cp, lp in component.ports.values() if cp == port)
        )
        try:
            r = httpx.get(f"http://127.0.0.1:{local}{get['path']}", timeout=timeout)
        except httpx.TransportError as exc:
            return False, repr(exc)
        return 200 <= r.status_code < 400, f"{r.status_code} {r.text[:200]}"
    raise AssertionError(f"unsupported probe handler {probe}")


def wait_probe(component: Component, name: str, budget: float | None = None) -> str:
    """Poll a probe at its period until it passes within what Kubernetes would allow."""
    probe = component.container[name]
    period = float(probe.get("periodSeconds", 10))
    allowed = budget or probe.get("initialDelaySeconds", 0) + period * probe.get(
        "failureThreshold", 3
    )
    deadline = time.monotonic() + allowed
    last = ""
    while time.monotonic() < deadline:
        ok, last = probe_once(component, probe)
        if ok:
            return last
        assert component.process.alive, (
            f"{component.key} exited:\n{component.process.log_text()[-4000:]}"
        )
        time.sleep(min(period, 0.5))
    raise AssertionError(
        f"{component.key} {name} failed for {allowed:.0f}s: {last}\n{component.process.log_text()[-4000:]}"
    )


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
        {"database.url": database_url, "broker.url": broker_url},
    )
    base = tmp_path_factory.mktemp("chart-run")
    artifacts = base / "artifacts"
    host_env = {
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
    }
    components: dict[str, Component] = {}
    for key in COMPONENTS:
        dep = find(objs, "Deployment", f"{PREFIX}-{kebab(key)}")
        pod = dep["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert "command" not in container, "the image entrypoint (tini) runs the args"
        volumes = Volumes(base / key, container, artifacts)
        env = {k: volumes.map(v) for k, v in resolve_env(objs, container).items()}
        env.update(host_env)
        env["TMPDIR"] = str(volumes.paths["/tmp"])
        comp = Component(key, container, pod, env, {n: lp for n, (_, lp) in volumes.ports.items()})
        comp.proc = ManagedProcess(
            name=key,
            command="exec " + shlex.join(volumes.map(a) for a in container["args"]),
            env=env,
            log_path=base / "logs" / f"{key}.log",
        )
        components[key] = comp

    # A tenant with real notes and an API key, made with the image's own CLI.
    admin_env = components["api"].env
    tenant = "chart-" + uuid4().hex[:6]
    exportctl = str(Path(sys.executable).parent / "exportctl")
    for args in (
        ["tenant", "create", tenant],
        ["notes", "import", str(notes_dir), "--tenant", tenant],
    ):
        subprocess.run([exportctl, *args], env=admin_env, cwd=ROOT, check=True, capture_output=True)
    key = subprocess.run(
        [exportctl, "apikey", "create", tenant, "--quiet"],
        env=admin_env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with psycopg.connect(database_url) as conn:
        note_ids = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM notes WHERE tenant_id = %s ORDER BY length(content) DESC", (tenant,)
            )
        ]

    for comp in components.values():
        comp.process.start()
    try:
        yield Deployment(components, database_url, key, note_ids)
    finally:
        for comp in components.values():
            if comp.process.alive:
                for child in comp.process.children():
                    os.kill(child, signal.SIGCONT)
                comp.process.stop(30)
        if os.environ.get("E2E_SHOW_LOGS"):
            for comp in components.values():
                print(f"===== {comp.key} =====\n{comp.process.log_text()[-5000:]}")
        servers.drop_database(db)


@pytest.mark.parametrize("key", COMPONENTS)
def test_every_probe_of_the_rendered_chart_passes(deployment: Deployment, key: str) -> None:
    component = deployment.components[key]
    outputs = {
        name: wait_probe(component, name, budget=90 if name == "startupProbe" else None)
        for name in PROBES
    }
    if key != "api":
        assert all(out.startswith("fresh") for out in outputs.values()), outputs


def job_status(conn: psycopg.Connection[Any], job_id: str) -> tuple[str, int]:
    row = conn.execute(
        "SELECT status, attempts FROM export_jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return row[0], row[1]


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
    component = deployment.components[key]
    proc = component.process
    assert proc.alive
    started = time.monotonic()
    lifecycle = component.container.get("lifecycle", {})
    if "preStop" in lifecycle:
        hook = run_exec(component, lifecycle["preStop"]["exec"]["command"], timeout=component.grace)
        assert hook.returncode == 0, hook.stdout + hook.stderr
    proc.signal(signal.SIGTERM)
    code = proc.wait(component.grace - (time.monotonic() - started))
    assert code == 0, proc.log_text()[-4000:]
    assert time.monotonic() - started < component.grace
