"""Fault drills on the real kubelet, with evidence as in ``devtools/drills``.

The same evidence records, job read-back and invariants as the local drills
(:class:`devtools.drills.harness.DrillEnvironment`), but the stack is the chart's release on
the test cluster: the drill reads PostgreSQL through its Service, submits over HTTP through
the Gateway (Traefik's HTTP listener; the api Service when no Gateway runs), reads
artifacts back from the S3 Service, follows the worker pods' logs
with ``kubectl logs -f`` and acts with ``kubectl`` and ``crictl`` — what an operator's
cluster does to the pods, never a signal of our own to a PID.

Drills: ``bulk_pod_delete_warm`` (preStop + TERM within the grace period: the export in hand
finishes, no WorkerLostError), ``bulk_pod_grace_exhausted`` (KILL after a short grace: the
job comes back through its lease), ``rollout_restart_all`` (every Deployment restarted under
submits: every 202 ends succeeded once; beat never runs twice), ``crictl_stop_worker``
(the runtime kills a worker container mid-export), ``api_pod_delete_under_load``,
``scale_fast_worker_under_load``; and those of the platform around the pods
(``platform_drills``: KEDA, the outbox-stuck alert, the recovery SLO, the dashboards'
queries).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from devtools.cluster import config as c
from devtools.cluster.deploy import NAMESPACE, dev_redis_password, fullname, service_url
from devtools.cluster.kube import crictl, kubectl
from devtools.cluster.platform import gateway_programmed, gateway_url
from devtools.drills.checks import claim_events, kinds, lease_recovery
from devtools.drills.config import DrillSettings
from devtools.drills.evidence import Evidence, JobWatcher, LogIndex, collect, now_iso
from devtools.drills.harness import (
    DrillEnvironment,
    Tenant,
    drill_probe,
    stage_notes,
    wait_for,
)
from devtools.drills.load import LoadGenerator, check_answers
from devtools.drills.registry import DrillContext
from devtools.stack import ROOT
from exportcore.settings import Settings

Say = Callable[[str], None]
WORKERS = ("fast-worker", "bulk-worker")
FAULTS_FILE = "/run/notes-exports/faults.json"
# devtools/cluster/values.yaml runs the stack with these (a test checks they agree).
CLUSTER_DRILL_SETTINGS = DrillSettings(
    lease_seconds=10.0,
    scanner_interval_seconds=2.0,
    retry_base_seconds=0.2,
    retry_cap_seconds=2.0,
    dispatch_threshold_seconds=60.0,
    fast_worker_concurrency=2,
    bulk_worker_concurrency=1,
    task_time_limit=120,
)


def component_selector(component: str) -> str:
    """Label selector of one component's pods of the release."""
    return f"app.kubernetes.io/instance={RELEASE_LABEL()},app.kubernetes.io/component={component}"


def RELEASE_LABEL() -> str:
    """The release's instance label."""
    from devtools.cluster.deploy import RELEASE

    return RELEASE


def pods(component: str) -> list[dict[str, Any]]:
    """The component's pods (the API's view), oldest first."""
    out = kubectl("-n", NAMESPACE, "get", "pods", "-l", component_selector(component), "-o", "json")
    items = json.loads(out)["items"]
    return sorted(items, key=lambda p: p["metadata"]["creationTimestamp"])


def running_pod(component: str, exclude: Set[str] = frozenset()) -> dict[str, Any]:
    """A Ready, not terminating pod of the component."""

    def ready(p: dict[str, Any]) -> bool:
        conds = p.get("status", {}).get("conditions", [])
        return (
            p["metadata"].get("deletionTimestamp") is None
            and p["metadata"]["name"] not in exclude
            and any(x["type"] == "Ready" and x["status"] == "True" for x in conds)
        )

    pod: dict[str, Any] = wait_for(
        lambda: next((p for p in pods(component) if ready(p)), None),
        180,
        f"a ready {component} pod",
    )
    return pod


def k8s_time(value: str | None) -> float | None:
    """Unix time of a Kubernetes timestamp (RFC 3339, second precision)."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class PodLogs:
    """Follows the logs of every pod of some components with ``kubectl logs -f --timestamps``
    (also of pods created later), so a deleted pod's last lines stay readable: ``<pod>.log``
    holds the lines as the process wrote them (indexed by job id like the local stack's
    logs), ``<pod>.ts.log`` the same lines behind the kubelet's receive time."""

    def __init__(self, out: Path, components: tuple[str, ...] = WORKERS) -> None:
        self.out = out
        self.components = components
        self.index = LogIndex({})
        self.followers: dict[str, subprocess.Popen[bytes]] = {}
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-logs", daemon=True)

    def start(self) -> PodLogs:
        """Start following (the pods there now, then every new one)."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.scan()
        self._thread.start()
        return self

    def scan(self) -> None:
        """Start a follower for every pod not followed yet whose container started."""
        for comp in self.components:
            for p in pods(comp):
                name = p["metadata"]["name"]
                statuses = p.get("status", {}).get("containerStatuses", [])
                started = any(
                    s.get("state", {}).get("running") or s.get("state", {}).get("terminated")
                    for s in statuses
                )
                if name in self.followers or not started:
                    continue
                cmd = ["kubectl", "--kubeconfig", str(c.KUBECONFIG), "-n", NAMESPACE]
                proc = subprocess.Popen(
                    [*cmd, "logs", "-f", "--timestamps", "--tail=-1", name],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                )
                self.followers[name] = proc
                self.index.paths[name] = self.out / f"{name}.log"
                self.index.offsets[name] = 0
                self.index.tails[name] = b""
                t = threading.Thread(target=self._copy, args=(name, proc), daemon=True)
                t.start()
                self._threads.append(t)

    def _copy(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        raw_path, ts_path = self.out / f"{name}.log", self.out / f"{name}.ts.log"
        with open(raw_path, "ab") as raw, open(ts_path, "ab") as ts:
            for line in proc.stdout:
                ts.write(line)
                ts.flush()
                raw.write(line.split(b" ", 1)[1] if b" " in line else line)
                raw.flush()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.scan()
            self._stop.wait(1.0)

    def text(self, pod: str) -> str:
        """Everything followed of one pod so far (as the process wrote it)."""
        path = self.out / f"{pod}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def first_time(self, pod: str, needle: str) -> float | None:
        """Unix time at which the kubelet received the first line of ``pod`` containing
        ``needle`` (RFC 3339 with nanoseconds), None when no line has it."""
        path = self.out / f"{pod}.ts.log"
        if not path.exists():
            return None
        for line in path.read_text(errors="replace").splitlines():
            stamp, _, rest = line.partition(" ")
            if needle in rest:
                whole, _, frac = stamp.rstrip("Z").partition(".")
                base = datetime.fromisoformat(whole + "+00:00").timestamp()
                return base + float(f"0.{frac or '0'}")
        return None

    def stop(self) -> None:
        """Stop every follower."""
        self._stop.set()
        self._thread.join(timeout=5)
        for proc in self.followers.values():
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        for t in self._threads:
            t.join(timeout=5)


class ClusterDrillEnvironment(DrillEnvironment):
    """The release on the test cluster seen as a drill environment: database, broker, api
    and store reached through their Services from this machine."""

    def __init__(self, out: Path, say: Say = print) -> None:
        # Only what the inherited read-back, submit and evidence methods use.
        self.settings = CLUSTER_DRILL_SETTINGS
        self.say = say
        self.base = out
        self.notes_source = Path("/usr/share/doc")
        pg = service_url("postgresql", "postgresql").removeprefix("http://")
        rd = service_url("redis", "redis").removeprefix("http://")
        self.database_url = f"postgresql://exports:exports-dev-only@{pg}/exports"
        self.broker_url = f"redis://exports:{dev_redis_password()}@{rd}/0"
        # through the Gateway (Traefik), as a user reaches it; the Service without one
        self._api_url = gateway_url() if gateway_programmed() else service_url()
        self.stack = None
        self.base_tenant: Tenant | None = None
        self._db = drill_probe(self.database_url)
        self._celery: Any = None
        self.pod_logs = PodLogs(out / "pod-logs")
        self._logs = self.pod_logs.index
        self.started_at = time.time()
        self.warmup: dict[str, Any] = {}

    @property
    def api_url(self) -> str:
        """The Gateway's HTTP listener (Traefik), or the api Service without a Gateway."""
        return self._api_url

    def core_settings(self) -> Settings:
        """exportcore settings naming the cluster's database, broker and S3 store."""
        return Settings.model_validate(
            {
                "database_url": self.database_url,
                "celery_broker_url": self.broker_url,
                "artifact_url": "s3://notes-exports/artifacts",
                "s3_endpoint_url": f"http://{c.S3_SERVICE_IP}:9000",
                "s3_region": "us-east-1",
                "s3_addressing_style": "path",
                "s3_access_key_id": "notes-exports-test",
                "s3_secret_access_key": "notes-exports-test-secret",
            }
        )

    def start(self) -> None:
        """A tenant with real notes, the log followers, and one export per queue."""
        self.base.mkdir(parents=True, exist_ok=True)
        notes_dir = stage_notes(self.notes_source, self.base / "notes")
        self.base_tenant = self._create_tenant("cluster-drills", notes_dir=notes_dir)
        self.pod_logs.start()
        self._warm_up()

    def close(self) -> None:
        """Stop following logs and close the database connections."""
        self.pod_logs.stop()
        self.db.close()

    # --- faults inside a pod ---------------------------------------------------------------

    def arm_in_pod(self, pod: str, point: str, fault: str, times: int = 1) -> None:
        """Arm a failpoint in the faults file of one pod (EXPORTS_FAULTS_FILE, test values)."""
        code = (
            "from pathlib import Path; from exportcore import faults; "
            f"faults.arm(Path({FAULTS_FILE!r}), {point!r}, {fault!r}, {times})"
        )
        kubectl("-n", NAMESPACE, "exec", pod, "--", "python", "-c", code)

    def hits_in_pod(self, pod: str, point: str) -> list[dict[str, Any]]:
        """Injections of a failpoint in one pod."""
        code = (
            "import json; from pathlib import Path; from exportcore import faults; "
            f"print(json.dumps(faults.hits(Path({FAULTS_FILE!r}), {point!r})))"
        )
        return list(json.loads(kubectl("-n", NAMESPACE, "exec", pod, "--", "python", "-c", code)))


@dataclass
class Sample:
    """Counts of running containers of one component over time (the runtime's view)."""

    name: str
    interval: float = 0.25
    seen: list[tuple[float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sample:
        """Sample ``crictl ps --name NAME --state running`` in a thread."""

        def run() -> None:
            while not self._stop.is_set():
                with contextlib.suppress(Exception):
                    ids = crictl(
                        "ps", "--name", f"^{self.name}$", "--state", "running", "-q", timeout=10
                    ).split()
                    self.seen.append((time.time(), len(ids)))
                self._stop.wait(self.interval)

        self._thread = threading.Thread(target=run, name=f"sample-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop; returns the largest count seen."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return max((n for _, n in self.seen), default=0)


# --- drills ------------------------------------------------------------------------------------


def _terminated_state(pod: str, container: str, timeout: float) -> dict[str, Any]:
    """The terminated state of a container, read from the pod (before it is removed) or,
    once removed, from the runtime's last record of it."""

    def read() -> dict[str, Any] | None:
        out = kubectl(
            "-n", NAMESPACE, "get", "pod", pod, "-o", "json", "--ignore-not-found", timeout=10
        )
        if not out.strip():
            return {"removed": True}
        for st in json.loads(out).get("status", {}).get("containerStatuses", []):
            if st["name"] == container and st.get("state", {}).get("terminated"):
                return dict(st["state"]["terminated"])
        return None

    terminated: dict[str, Any] = wait_for(read, timeout, f"{pod} to terminate")
    return terminated


def _bulk_export_stalled(ctx: DrillContext, seconds: float) -> tuple[str, str]:
    """A bulk export running on a ready bulk-worker pod and stalled there in a render chunk
    for ``seconds`` (a failpoint armed in that pod): returns (pod name, job id) once the
    job runs."""
    env = ctx.env
    assert isinstance(env, ClusterDrillEnvironment)
    pod = running_pod("bulk-worker")["metadata"]["name"]
    env.arm_in_pod(pod, "render.chunk", f"sleep:{seconds:g}", 1)
    job = ctx.submit(ctx.bulk())
    wait_for(
        lambda: env.hits_in_pod(pod, "render.chunk"), 60, "the bulk export to stall in a chunk"
    )
    env.db.wait_status(job, "running", 10)
    return pod, job


def bulk_pod_delete_warm(ctx: DrillContext) -> None:
    """kubectl delete pod of the bulk worker in the middle of an export: preStop stops the
    consumer, TERM starts the warm shutdown, the export in hand finishes on its first and
    only attempt, the container exits 0 within the grace period, no WorkerLostError."""
    env, ev = ctx.env, ctx.ev
    assert isinstance(env, ClusterDrillEnvironment)
    # Longer than the preStop takes (a celery control client, which imports the worker's
    # app) so TERM finds the task in hand: it took 40 s with the node at load 15, and with
    # a 25 s stall the export finished before TERM came (the drill then proves nothing).
    pod, job = _bulk_export_stalled(ctx, 60)
    deleted_at = ev.note("kubectl delete pod", pod=pod)
    kubectl("-n", NAMESPACE, "delete", "pod", pod, "--wait=false")
    ev.fault = {"action": "kubectl delete pod", "pod": pod, "grace_seconds": 150}
    term = _terminated_state(pod, "bulk-worker", 160)
    row = env.db.wait_terminal(job, 60)
    time.sleep(2)  # the follower reads the last lines after the container ended
    logs = env.pod_logs.text(pod)
    cancel_at = env.pod_logs.first_time(pod, "Canceling queue")
    term_at = env.pod_logs.first_time(pod, "Warm shutdown")
    exited_at = k8s_time(term.get("finishedAt"))
    finished = row["finished_at"].timestamp() if row["finished_at"] else None
    ev.observe("container_terminated", term)
    ev.observe(
        "seconds",
        {
            "delete_to_consumer_cancelled_by_prestop": _between(deleted_at, cancel_at),
            "delete_to_term_warm_shutdown": _between(deleted_at, term_at),
            "term_to_export_finished": _between(term_at, finished),
            "term_to_container_exit": _between(term_at, exited_at),
            "delete_to_container_exit": _between(deleted_at, exited_at),
            "grace_period": 150,
        },
    )
    ev.check_eq("the export succeeded", row["status"], "succeeded")
    ev.check_eq("on its first attempt (the shutdown cost no attempt)", row["attempts"], 1)
    ev.check_eq("one claim, one lease token", len(claim_events(env.db.history(job))), 1)
    ev.check("the container exited 0 (warm shutdown, not KILL)", term.get("exitCode") == 0, term)
    ev.check(
        "preStop stopped the consumer before TERM started the warm shutdown",
        cancel_at is not None and term_at is not None and cancel_at <= term_at,
        f"consumer cancelled {cancel_at}, warm shutdown {term_at}",
    )
    ev.check(
        "TERM came while the export was in hand, and it finished anyway",
        term_at is not None and finished is not None and term_at < finished,
        f"warm shutdown {term_at}, export finished {finished}",
    )
    ev.check(
        "no WorkerLostError anywhere",
        "WorkerLostError" not in logs and row["error_code"] is None,
        row["error_code"],
    )
    ev.check(
        "the export finished before the container exited, within the grace period",
        finished is not None
        and exited_at is not None
        and finished <= exited_at + 1.0
        and exited_at - deleted_at < 150,
        f"finished {finished}, exited {exited_at} (second precision)",
    )


def _between(a: float | None, b: float | None) -> float | None:
    return round(b - a, 3) if a is not None and b is not None else None


def bulk_pod_grace_exhausted(ctx: DrillContext) -> None:
    """kubectl delete pod --grace-period=3 while the export stalls for longer: the kubelet
    KILLs the container; the job comes back through its lease on the replacement pod."""
    env, ev = ctx.env, ctx.ev
    assert isinstance(env, ClusterDrillEnvironment)
    pod, job = _bulk_export_stalled(ctx, 60)
    deleted_at = ev.note("kubectl delete pod --grace-period=3", pod=pod)
    kubectl("-n", NAMESPACE, "delete", "pod", pod, "--grace-period=3", "--wait=false")
    ev.fault = {"action": "kubectl delete pod --grace-period=3", "pod": pod}
    term = _terminated_state(pod, "bulk-worker", 60)
    ev.observe("container_terminated", term)
    ev.check(
        "the grace period ran out: the container was killed",
        term.get("exitCode") == 137 or bool(term.get("removed")),
        term,
    )
    # The worker died when the kubelet's KILL came: at the end of the grace period (the
    # runtime's finishedAt has second precision and may read earlier).
    died_at = max(deleted_at + 3.0, k8s_time(term.get("finishedAt")) or 0.0)
    ev.note("KILL at the end of the grace period", at=died_at)
    lease_recovery(ctx, job, died_at, "after the grace period ran out")


def _restart_all(ev: Evidence) -> list[str]:
    names = kubectl(
        "-n",
        NAMESPACE,
        "get",
        "deployments",
        "-l",
        f"app.kubernetes.io/instance={RELEASE_LABEL()}",
        "-o",
        "name",
    ).split()
    ev.note("kubectl rollout restart", deployments=names)
    kubectl("-n", NAMESPACE, "rollout", "restart", *names)
    for name in names:
        kubectl("-n", NAMESPACE, "rollout", "status", name, "--timeout=600s", timeout=620)
    ev.note("every rollout complete")
    return names


def _under_load(ctx: DrillContext, rate: float, action: Callable[[], Any]) -> LoadGenerator:
    """Run ``action`` while submits arrive at ``rate``/s; every accepted job is tracked."""
    load = LoadGenerator(
        ctx.env, ctx.tenant, rate, threads=3, bulk_share=0.05, max_notes=6, seed=14
    )
    load.on_accepted = lambda a: ctx.ev.track(a.job_id, "load")
    load.start()
    time.sleep(3)
    try:
        action()
        time.sleep(3)
    finally:
        load.stop()
    return load


def _all_succeeded_once(ctx: DrillContext, load: LoadGenerator) -> None:
    env, ev = ctx.env, ctx.ev
    ids = [a.job_id for a in load.accepted if a.job_id]
    deadline = time.time() + 240
    rows: dict[str, dict[str, Any]] = {}
    while time.time() < deadline:
        rows = {
            str(r["id"]): r
            for r in env.db.sql(
                "SELECT id, status FROM export_jobs WHERE id = ANY(%s::uuid[])", (ids,)
            )
        }
        if all(rows.get(i, {}).get("status") in ("succeeded", "failed", "cancelled") for i in ids):
            break
        time.sleep(1)
    states: dict[str, int] = {}
    for r in rows.values():
        states[r["status"]] = states.get(r["status"], 0) + 1
    ev.observe("accepted_jobs_by_status", states)
    ev.check("every 202 ended succeeded", bool(ids) and states == {"succeeded": len(ids)}, states)
    check_answers(ev, env, ctx.tenant, load.attempts, allowed_errors=set())
    refused = load.refused
    ev.check(
        "every submit was answered 202 (no request lost to the restart)",
        not refused,
        load.outcome_counts(),
    )


def rollout_restart_all(ctx: DrillContext) -> None:
    """kubectl rollout restart of every Deployment of the release while exports arrive:
    every 202 ends succeeded, none twice (the invariants), no submit lost; beat never runs
    as two containers (Recreate)."""
    beat = Sample("beat").start()
    try:
        load = _under_load(ctx, 1.0, lambda: _restart_all(ctx.ev))
    finally:
        most = beat.stop()
    ctx.ev.observe("beat_running_containers_max", most)
    ctx.ev.observe("beat_samples", len(beat.seen))
    ctx.ev.check(
        "beat never ran as two containers",
        most <= 1 and len(beat.seen) > 10,
        f"max {most} over {len(beat.seen)} samples",
    )
    _all_succeeded_once(ctx, load)


def crictl_stop_worker(ctx: DrillContext) -> None:
    """The runtime kills a worker's container in the middle of an export (crictl stop
    --timeout 0: KILL, no preStop, no TERM; the bulk worker, whose pod has the faults file):
    the kubelet restarts the container and the job comes back through its lease."""
    env, ev = ctx.env, ctx.ev
    assert isinstance(env, ClusterDrillEnvironment)
    pod, job = _bulk_export_stalled(ctx, 60)
    (cid,) = crictl("ps", "--name", "^bulk-worker$", "--pod", _pod_sandbox(pod), "-q").split()
    restarts = _restart_count(pod, "bulk-worker")
    killed_at = ev.note("crictl stop --timeout 0", container=cid, pod=pod)
    crictl("stop", "--timeout", "0", cid)
    ev.fault = {"action": "crictl stop --timeout 0", "container": cid, "pod": pod}
    wait_for(
        lambda: _restart_count(pod, "bulk-worker") > restarts,
        120,
        "the kubelet to restart the container",
    )
    ev.check(
        "the kubelet restarted the container",
        True,
        f"restartCount {restarts} -> {_restart_count(pod, 'bulk-worker')}",
    )
    lease_recovery(ctx, job, killed_at, "after the runtime killed the container")


def _pod_sandbox(pod: str) -> str:
    return crictl("pods", "--name", f"^{pod}$", "-q").split()[0]


def _restart_count(pod: str, container: str) -> int:
    out = kubectl("-n", NAMESPACE, "get", "pod", pod, "-o", "json")
    return next(
        int(s["restartCount"])
        for s in json.loads(out)["status"]["containerStatuses"]
        if s["name"] == container
    )


def api_pod_delete_under_load(ctx: DrillContext) -> None:
    """One of the two api pods deleted while exports arrive: its preStop drains it out of
    the Service, gunicorn finishes the requests in flight; every submit is answered 202 and
    every 202 ends succeeded once."""
    pod = running_pod("api")["metadata"]["name"]

    def delete() -> None:
        ctx.ev.note("kubectl delete pod (api)", pod=pod)
        kubectl("-n", NAMESPACE, "delete", "pod", pod, "--wait=true", timeout=120)
        kubectl(
            "-n",
            NAMESPACE,
            "rollout",
            "status",
            f"deployment/{fullname()}-api",
            "--timeout=300s",
            timeout=320,
        )

    _all_succeeded_once(ctx, _under_load(ctx, 1.5, delete))


def scale_fast_worker_under_load(ctx: DrillContext) -> None:
    """fast-worker scaled to 3 and back to 1 while exports arrive: the removed pods stop
    consuming and finish what they hold; every 202 ends succeeded once."""
    deployment = f"deployment/{fullname()}-fast-worker"

    def scale() -> None:
        for n in (3, 1):
            ctx.ev.note("kubectl scale", replicas=n)
            kubectl("-n", NAMESPACE, "scale", deployment, f"--replicas={n}")
            kubectl("-n", NAMESPACE, "rollout", "status", deployment, "--timeout=300s", timeout=320)

            def settled(n: int = n) -> bool:
                staying = [
                    p for p in pods("fast-worker") if not p["metadata"].get("deletionTimestamp")
                ]
                return len(staying) == n and len(pods("fast-worker")) == n

            wait_for(settled, 300, f"{n} fast-worker pods")

    load = _under_load(ctx, 1.5, scale)
    env = ctx.env
    assert isinstance(env, ClusterDrillEnvironment)
    gone = [
        n
        for n in env.pod_logs.followers
        if n.startswith(f"{fullname()}-fast-worker")
        and not any(p["metadata"]["name"] == n for p in pods("fast-worker"))
    ]
    lost = [n for n in gone if "WorkerLostError" in env.pod_logs.text(n)]
    ctx.ev.observe("fast_worker_pods_removed", gone)
    ctx.ev.check("no removed pod logged a WorkerLostError", not lost, lost)
    _all_succeeded_once(ctx, load)


DRILLS: dict[str, tuple[str, Callable[[DrillContext], None]]] = {
    "bulk_pod_delete_warm": (
        "kubectl delete pod of the bulk worker mid-export: warm shutdown",
        bulk_pod_delete_warm,
    ),
    "bulk_pod_grace_exhausted": (
        "grace period exhausted: recovery through the lease",
        bulk_pod_grace_exhausted,
    ),
    "rollout_restart_all": (
        "rollout restart of every Deployment under submits",
        rollout_restart_all,
    ),
    "crictl_stop_worker": ("the runtime kills a worker container mid-export", crictl_stop_worker),
    "api_pod_delete_under_load": ("an api pod deleted under load", api_pod_delete_under_load),
    "scale_fast_worker_under_load": (
        "fast-worker scaled up and down under load",
        scale_fast_worker_under_load,
    ),
}


def run_drills(
    say: Say = print, only: list[str] | None = None, out: Path | None = None
) -> list[dict[str, Any]]:
    """Run the drills (``only``, or all: the platform's too unless ``CLUSTER_PLATFORM=0``)
    one after the other on the release; one evidence file each under
    ``.cluster/evidence/<time>/``; returns their summaries. ``ValueError`` for an unknown
    name."""
    from devtools.cluster.platform_drills import PLATFORM_DRILLS

    known = {**DRILLS, **PLATFORM_DRILLS}
    names = only or list(known if c.platform_enabled() else DRILLS)
    unknown = set(names) - set(known)
    if unknown:
        raise ValueError(f"unknown drills {sorted(unknown)}; known: {', '.join(known)}")
    out = out or c.EVIDENCE / time.strftime("%Y%m%d-%H%M%S")
    env = ClusterDrillEnvironment(out, say)
    results = []
    try:
        env.start()
        say(f"drill environment ready (warm-up {env.warmup.get('seconds')} s); evidence in {out}")
        for name in names:
            title, fn = known[name]
            ev = Evidence(name, title, "cluster", None)
            ev.settings = env.settings.as_dict()
            ev.budgets = env.settings.budgets()
            tenant = env.new_tenant(name)
            watcher = JobWatcher(env, tenant.id).start()
            ctx = DrillContext(env=env, ev=ev, tenant=tenant, watcher=watcher)
            error: BaseException | None = None
            try:
                fn(ctx)
            except Exception as exc:
                error = exc
                say("".join(traceback.format_exception(exc))[-1500:])
            finally:
                watcher.stop()
            with contextlib.suppress(Exception):
                # every job read back by a few threads: a rollout under load tracks hundreds
                # of jobs, and each read-back fetches the artifact through the S3 Service
                collect(env, ev, watcher, readers=6)
            ev.finish(error)
            path = ev.write(out)
            results.append(
                {
                    "drill": name,
                    "verdict": ev.verdict,
                    "reason": ev.reason,
                    "seconds": round(ev.seconds, 1),
                    "evidence": str(path),
                }
            )
            say(f"{name}: {ev.verdict} ({ev.seconds:.0f} s) — {ev.reason[:300]}")
    finally:
        env.close()
    (out / "summary.json").write_text(
        json.dumps({"at": now_iso(), "drills": results}, indent=1) + "\n"
    )
    return results


__all__ = ["DRILLS", "ROOT", "ClusterDrillEnvironment", "kinds", "run_drills"]
