"""Running the rendered chart's commands here, as Kubernetes would run them in the pods.

For each component the Deployment's container args, environment (ConfigMap + Secret + env,
exactly as rendered) and probes are taken from the YAML. Only the container's volumes are
mapped to local folders (``/run/notes-exports``, the artifact mount, ``/tmp`` as TMPDIR) and
the listening address to a free loopback port. Used by ``test_chart_commands.py`` (file
backend) and ``test_chart_commands_s3.py`` (s3 backend against a real S3 server).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import psycopg

from devtools.stack import ROOT, ManagedProcess, free_port
from tests.chart.conftest import RELEASE, find

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
    tenant: str = ""

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


def stop_like_kubelet(component: Component) -> tuple[int | None, float]:
    """Stop the component as the kubelet does: its preStop hook (which must succeed), then
    TERM to the main process, all within its grace period. Returns the exit code and the
    seconds it took."""
    proc = component.process
    started = time.monotonic()
    lifecycle = component.container.get("lifecycle", {})
    if "preStop" in lifecycle:
        hook = run_exec(component, lifecycle["preStop"]["exec"]["command"], timeout=component.grace)
        assert hook.returncode == 0, hook.stdout + hook.stderr
    proc.signal(signal.SIGTERM)
    code = proc.wait(component.grace - (time.monotonic() - started))
    return code, time.monotonic() - started


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


def check_every_probe(component: Component) -> None:
    """Each probe of the container (:data:`PROBES`) passes, as :func:`wait_probe` polls it
    (the startup probe within 90 s, the process's first start included); the heartbeat
    probes of every component but the api report a fresh heartbeat."""
    outputs = {
        name: wait_probe(component, name, budget=90 if name == "startupProbe" else None)
        for name in PROBES
    }
    if component.key != "api":
        assert all(out.startswith("fresh") for out in outputs.values()), outputs


def check_clean_stop(component: Component) -> None:
    """The running component stops as the kubelet stops it (:func:`stop_like_kubelet`) with
    exit code 0 within its rendered grace period."""
    proc = component.process
    assert proc.alive, proc.log_text()[-4000:]
    code, seconds = stop_like_kubelet(component)
    assert code == 0, proc.log_text()[-4000:]
    assert seconds < component.grace


def job_status(conn: psycopg.Connection[Any], job_id: str) -> tuple[str, int]:
    row = conn.execute(
        "SELECT status, attempts FROM export_jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return row[0], row[1]


@contextlib.contextmanager
def launch(
    objs: list[dict[str, Any]],
    keys: Iterable[str],
    *,
    base: Path,
    database_url: str,
    notes_dir: Path,
) -> Iterator[Deployment]:
    """Start the rendered Deployments ``keys`` (values.yaml component keys) here, after
    creating a tenant with real notes and an API key with the image's own CLI; stops them
    all on exit."""
    artifacts = base / "artifacts"
    host_env = {
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
    }
    components: dict[str, Component] = {}
    for key in keys:
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
        yield Deployment(components, database_url, key, note_ids, tenant)
    finally:
        for comp in components.values():
            if comp.process.alive:
                for child in comp.process.children():
                    os.kill(child, signal.SIGCONT)
                comp.process.stop(30)
        if os.environ.get("E2E_SHOW_LOGS"):
            for comp in components.values():
                print(f"===== {comp.key} =====\n{comp.process.log_text()[-5000:]}")
