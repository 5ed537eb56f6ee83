"""Drills of the platform around the pods: KEDA scaling fast-worker on the real backlog,
the outbox-stuck alert of the chart's PrometheusRule firing and resolving in Prometheus,
the recovery SLO query showing a killed worker's recovery, and every dashboard panel query
answering (after a retry, a dead letter and a refusal made on purpose). They run like the
pod drills (``drills.run_drills``, one evidence file each) against the release on the test
cluster.

Also here, for the cluster tests: :class:`Prometheus` (the HTTP query API),
:func:`dashboard_data` (every panel query of the chart's dashboards, run on that
Prometheus) and :func:`export_traces` (an export's traces in Jaeger's query API).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import yaml

from devtools import grafana
from devtools.cluster.deploy import CHART, NAMESPACE, fullname, install
from devtools.cluster.drills import (
    ClusterDrillEnvironment,
    crictl_stop_worker,
    pods,
    running_pod,
)
from devtools.cluster.kube import kubectl
from devtools.cluster.platform import prometheus_url
from devtools.drills.harness import Tenant, wait_for
from devtools.drills.registry import DrillContext
from exportcore.db import make_pool
from exportcore.domain import ExportFormat, ExportRequest
from exportcore.submit import submit_export

SCRAPE_SECONDS = 5.0  # the test Prometheus and the cluster values' ServiceMonitor interval
EVALUATION_SECONDS = 5.0
TERMINAL = ("succeeded", "failed", "cancelled")
SUBMITTERS = 8  # the KEDA drill's producer threads (one connection each)


class Prometheus:
    """The Prometheus HTTP API (``/api/v1``) at ``url``."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url or prometheus_url()

    def _get(self, path: str, **params: str) -> Any:
        r = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=20)
        r.raise_for_status()
        body = r.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar as one sample) of ``expr`` now."""
        data = self._get("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def alerts(self, name: str) -> list[dict[str, Any]]:
        """Active (pending or firing) alerts called ``name``."""
        return [a for a in self._get("alerts")["alerts"] if a["labels"].get("alertname") == name]

    def first_true(self, expr: str, start: float, end: float, step: float) -> float | None:
        """The first time (epoch s) in [start, end], at ``step`` s resolution, at which
        ``expr`` answered a sample (an alert's condition holds), or None."""
        data = self._get(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}"
        )
        times = [float(v[0]) for series in data["result"] for v in series["values"]]
        return min(times) if times else None

    def rule(self, name: str) -> dict[str, Any] | None:
        """The loaded alerting or recording rule called ``name``."""
        for group in self._get("rules")["groups"]:
            for rule in group["rules"]:
                if rule["name"] == name:
                    return dict(rule)
        return None

    def targets_up(self) -> dict[str, int]:
        """{scrape pool: targets up} of the active targets."""
        up: dict[str, int] = {}
        for t in self._get("targets", state="active")["activeTargets"]:
            up.setdefault(t["scrapePool"], 0)
            up[t["scrapePool"]] += t["health"] == "up"
        return up


def dashboard_data(prom: Prometheus) -> dict[str, Any]:
    """Every panel query of the chart's dashboards (``files/dashboards``) run on ``prom``:
    {"queries": n, "empty": [(dashboard, panel, expr)...]}; a query that answers no sample
    is empty (a NaN sample is data: a ratio of zero rates)."""
    empty = []
    exprs = grafana.dashboard_expressions({"__range": "30m"})
    for board, panel, expr in exprs:
        if not prom.query(expr):
            empty.append((board, panel, expr))
    return {"queries": len(exprs), "empty": empty}


@dataclass
class ReplicaSampler:
    """fast-worker's desired, ready and KEDA/HPA-reported replicas every ``interval`` s."""

    deployment: str
    interval: float = 1.0
    # the backlog as the trigger counts it, sampled beside the replicas (None: not sampled)
    backlog: Callable[[], int] | None = None
    seen: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ReplicaSampler:
        def run() -> None:
            while not self._stop.is_set():
                with contextlib.suppress(Exception):
                    d = json.loads(
                        kubectl("-n", NAMESPACE, "get", self.deployment, "-o", "json", timeout=10)
                    )
                    sample = {
                        "at": round(time.time(), 2),
                        "desired": d["spec"].get("replicas"),
                        "ready": d["status"].get("readyReplicas", 0),
                    }
                    if self.backlog is not None:
                        sample["backlog"] = self.backlog()
                    self.seen.append(sample)
                self._stop.wait(self.interval)

        self._thread = threading.Thread(target=run, name="replicas", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def first(self, at_least: int, key: str = "desired", after: float = 0.0) -> float | None:
        """Time of the first sample with ``key`` >= ``at_least`` after ``after``."""
        return next(
            (s["at"] for s in self.seen if s["at"] >= after and (s[key] or 0) >= at_least), None
        )


def _wait_all_terminal(ctx: DrillContext, ids: list[str], timeout: float) -> dict[str, int]:
    """Wait until every job of ``ids`` is terminal; {status: count}."""
    env = ctx.env

    def counts() -> dict[str, int]:
        rows = env.db.sql(
            "SELECT status, count(*) AS n FROM export_jobs WHERE id = ANY(%s::uuid[]) "
            "GROUP BY status",
            (ids,),
        )
        return {r["status"]: int(r["n"]) for r in rows}

    with contextlib.suppress(Exception):
        wait_for(
            lambda: sum(v for k, v in counts().items() if k in TERMINAL) == len(ids),
            timeout,
            f"{len(ids)} exports to finish",
        )
    return counts()


def fast_worker_cpu_limit() -> str:
    """The chart's own CPU limit of a fast-worker pod (its ``values.yaml``); the test values
    give it a whole core of the node's two."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return str(values["components"]["fastWorker"]["resources"]["limits"]["cpu"])


def turn_on_fast_worker_scaling() -> dict[str, Any]:
    """``helm upgrade --reuse-values`` of the running release (with its own image) turning
    on fast-worker's ScaledObject, its pods at the chart's CPU limit as in production;
    returns the ScaledObject once KEDA says it is Ready (it reads the backlog).
    ``RuntimeError`` when the release's image is not given by a tag."""
    name = f"{fullname()}-fast-worker"
    d = json.loads(kubectl("-n", NAMESPACE, "get", "deployment", name, "-o", "json"))
    image = d["spec"]["template"]["spec"]["containers"][0]["image"]
    if "@" in image or ":" not in image:
        raise RuntimeError(f"{name} runs {image}: the drill reinstalls the release by tag")
    install(
        image.rsplit(":", 1)[1],
        [
            "--reuse-values",
            "--set", "components.fastWorker.keda.enabled=true",
            "--set", f"components.fastWorker.resources.limits.cpu={fast_worker_cpu_limit()}",
        ],
    )  # fmt: skip

    def ready() -> dict[str, Any] | None:
        so: dict[str, Any] = json.loads(
            kubectl("-n", NAMESPACE, "get", "scaledobject", name, "-o", "json")
        )
        conds = {x["type"]: x["status"] for x in so.get("status", {}).get("conditions", [])}
        return so if conds.get("Ready") == "True" else None

    found: dict[str, Any] = wait_for(
        ready, 120, "the ScaledObject to be Ready (KEDA reads the backlog)", interval=1
    )
    return found


def keda_scales_on_backlog(ctx: DrillContext) -> None:
    """fast-worker's ScaledObject turned on (:func:`turn_on_fast_worker_scaling`); three
    tenants submit 500 small and 20 bulk exports: KEDA's postgresql trigger sees
    the backlog (job rows, not the broker list) and fast-worker goes from 1 to at least 3
    replicas within 60 s, then back to its minimum after the drain and the cooldown; every
    export succeeds exactly once; the evidence holds the replica counts over time."""
    env, ev = ctx.env, ctx.ev
    assert isinstance(env, ClusterDrillEnvironment)
    deployment = f"deployment/{fullname()}-fast-worker"
    so = turn_on_fast_worker_scaling()
    minimum = int(so["spec"]["minReplicaCount"])
    ev.observe(
        "scaled_object",
        {
            k: so["spec"].get(k)
            for k in ("minReplicaCount", "maxReplicaCount", "pollingInterval", "cooldownPeriod")
        },
    )
    ev.observe("trigger", so["spec"]["triggers"][0]["type"])
    wait_for(
        lambda: (s := sampler_once(deployment)) and s["desired"] == minimum == s["ready"],
        300,
        f"fast-worker at its minimum ({minimum})",
    )
    # the backlog as KEDA reads it: the trigger's own query, as the chart rendered it
    query = so["spec"]["triggers"][0]["metadata"]["query"]

    def backlog() -> int:
        return int(env.db.sql(query)[0]["backlog"])

    sampler = ReplicaSampler(deployment, backlog=backlog).start()
    tenants = [ctx.tenant, env.new_tenant("keda-2"), env.new_tenant("keda-3")]
    # The burst goes in through the library's submit (exportcore.submit.submit_export: the
    # transaction the api runs, admission included) from the host, as an internal producer
    # would: on this 2-core node the two api pods accept exports about as fast as one
    # fast-worker drains them (measured: 520 through the Gateway in 24 s, drained with them,
    # the backlog never above 16, with the worker at a whole core and at 250m alike), so a
    # burst through them makes no backlog to scale on.
    settings = env.core_settings()
    small = [
        (ExportRequest.build(ExportFormat.JSON, t.note_ids[: 1 + i % 3], False), t)
        for i, t in zip(range(500), tenants * 167, strict=False)
    ]
    bulk = [
        (ExportRequest.build(ExportFormat.NDJSON, None, True), tenants[i % 3]) for i in range(20)
    ]
    requests = small + bulk
    started = ev.note("submitting", small=500, bulk=20, tenants=[t.id for t in tenants])
    ids: list[str] = []
    lock = threading.Lock()
    pool = make_pool(settings, "keda-drill", min_size=1, max_size=SUBMITTERS)

    def worker(part: list[tuple[ExportRequest, Tenant]]) -> None:
        for request, tenant in part:
            out = submit_export(
                pool, settings, tenant_id=tenant.id, request=request, source="drill"
            )
            job = str(out.job["id"])
            with lock:
                ids.append(job)
                ev.track(job, "backlog")

    threads = [
        threading.Thread(target=worker, args=(requests[i::SUBMITTERS],)) for i in range(SUBMITTERS)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        submitted = ev.note("every export accepted", jobs=len(ids))
        ev.check_eq("every export accepted", len(ids), len(requests))
        states = _wait_all_terminal(ctx, ids, 480)
        drained = ev.note("backlog drained", states=states)
        scaled_down = wait_for(
            lambda: (
                (s := sampler.seen[-1] if sampler.seen else None)
                and s["desired"] == minimum
                and s["at"] > drained
                and s["at"]
            ),
            int(so["spec"]["cooldownPeriod"]) + 240,
            "fast-worker back at its minimum",
        )
    finally:
        sampler.stop()
        pool.close()
    ev.observe("hpa", _hpa_status(so))
    up3 = sampler.first(3, after=started)
    ready3 = sampler.first(3, "ready", after=started)
    ev.observe("replica_timeline", sampler.seen)
    ev.observe("max_replicas", max((s["desired"] or 0) for s in sampler.seen))
    ev.observe("max_backlog", max((s.get("backlog") or 0) for s in sampler.seen))
    ev.observe(
        "seconds",
        {
            "submit_to_3_desired": _between(started, up3),
            "submit_to_3_ready": _between(started, ready3),
            "submitting": _between(started, submitted),
            "submit_to_drained": _between(started, drained),
            "drained_to_minimum": _between(drained, float(scaled_down)),
        },
    )
    ev.check(
        "fast-worker reached 3 replicas within 60 s of the first submit",
        up3 is not None and up3 - started <= 60,
        f"3 desired at {up3}, started {started}",
    )
    ev.check_eq("every export succeeded", states, {"succeeded": len(ids)})
    dup = env.db.sql(
        "SELECT count(*) AS n FROM export_job_events WHERE job_id = ANY(%s::uuid[]) "
        "AND kind = 'succeeded'",
        (ids,),
    )[0]["n"]
    ev.check_eq("each exactly once (one succeeded event per job)", int(dup), len(ids))
    ev.check(
        "fast-worker went back to its minimum after the drain and the cooldown",
        bool(scaled_down),
        scaled_down,
    )


def _hpa_status(so: dict[str, Any]) -> dict[str, Any]:
    """The status of the HorizontalPodAutoscaler KEDA made for ``so`` (its conditions say
    why it did or did not scale: e.g. FailedGetExternalMetric when the metrics API server
    cannot be reached); {} when it cannot be read."""
    name = so.get("status", {}).get("hpaName") or f"keda-hpa-{so['metadata']['name']}"
    with contextlib.suppress(Exception):
        hpa = json.loads(kubectl("-n", NAMESPACE, "get", "hpa", name, "-o", "json", timeout=10))
        st = hpa.get("status", {})
        return {
            "name": name,
            "current": st.get("currentReplicas"),
            "desired": st.get("desiredReplicas"),
            "metrics": st.get("currentMetrics"),
            "conditions": [
                {k: c.get(k) for k in ("type", "status", "reason", "message")}
                for c in st.get("conditions", [])
            ],
        }
    return {}


def sampler_once(deployment: str) -> dict[str, Any]:
    """Desired and ready replicas of a Deployment now."""
    d = json.loads(kubectl("-n", NAMESPACE, "get", deployment, "-o", "json", timeout=10))
    return {"desired": d["spec"].get("replicas"), "ready": d["status"].get("readyReplicas", 0)}


def _alert_for_seconds(prom: Prometheus, name: str) -> float:
    rule = wait_for(lambda: prom.rule(name), 180, f"Prometheus to load the rule {name}")
    return float(rule["duration"])


def outbox_stuck_alert(ctx: DrillContext) -> None:
    """The publisher scaled to 0 while exports arrive: NotesExportsOutboxStuck (the chart's
    PrometheusRule) goes pending, then firing within its ``for:`` plus two scrape intervals
    (and one evaluation) of the moment its condition held; with the publisher back it
    resolves, and every export succeeds once."""
    env, ev = ctx.env, ctx.ev
    prom = Prometheus()
    alert = "NotesExportsOutboxStuck"
    for_s = _alert_for_seconds(prom, alert)
    ev.observe("rule_for_seconds", for_s)
    ev.check_eq("the alert is not active before the drill", prom.alerts(alert), [])
    publisher = f"deployment/{fullname()}-publisher"
    stopped = ev.note("kubectl scale publisher --replicas=0")
    kubectl("-n", NAMESPACE, "scale", publisher, "--replicas=0")
    wait_for(lambda: not pods("publisher"), 120, "the publisher pod to be gone")
    ids: list[str] = []
    stop = threading.Event()

    def arrive() -> None:  # an export every 10 s while the publisher is away
        while not stop.is_set():
            ids.append(ctx.submit(ctx.small(2), role="while stuck"))
            stop.wait(10)

    feeder = threading.Thread(target=arrive, daemon=True)
    feeder.start()
    states: list[dict[str, Any]] = []

    def seen(state: str) -> float | None:
        return next((s["at"] for s in states if s["state"] == state), None)

    try:
        # the age (60 s), the holds' window (2 min, from the drill before), for:, margin
        deadline = time.time() + 60 + 120 + for_s + 60
        while time.time() < deadline and seen("firing") is None:
            for a in prom.alerts(alert):
                states.append({"at": time.time(), "state": a["state"], "activeAt": a["activeAt"]})
            time.sleep(1)
    finally:
        stop.set()
        feeder.join(timeout=30)
    first = env.db.sql(
        "SELECT extract(epoch FROM min(available_at))::float8 AS t FROM export_outbox "
        "WHERE job_id = ANY(%s::uuid[])",
        (ids,),
    )[0]["t"]
    aged_at = first + 60.0 if first else None  # the oldest due event older than 60 s
    # The alert's condition, as Prometheus evaluated the rule's own expression: the age
    # above, and no publisher hold in the last 2 minutes (a publisher that held messages
    # back just before it went away keeps the alert quiet until its holds age out).
    expr = (prom.rule(alert) or {}).get("query")
    condition_at = None
    if expr:
        with contextlib.suppress(Exception):
            condition_at = prom.first_true(expr, stopped, time.time(), 1.0)
    restarted = ev.note("kubectl scale publisher --replicas=1")
    kubectl("-n", NAMESPACE, "scale", publisher, "--replicas=1")
    kubectl("-n", NAMESPACE, "rollout", "status", publisher, "--timeout=300s", timeout=320)
    ready = ev.note("publisher ready")
    resolved = None
    with contextlib.suppress(Exception):
        resolved = wait_for(
            lambda: not prom.alerts(alert) and time.time(), 180, "the alert to resolve"
        )
    resolved_at = ev.note("alert resolved") if resolved else None
    pending, firing = seen("pending"), seen("firing")
    budget = for_s + 2 * SCRAPE_SECONDS + EVALUATION_SECONDS
    ev.observe("alert_states", states[:3] + states[-3:])
    ev.observe(
        "times",
        {
            "publisher_stopped": stopped,
            "oldest_event_60s_old": aged_at,
            "condition_true": condition_at,
            "pending": pending,
            "firing": firing,
            "publisher_back": restarted,
            "publisher_ready": ready,
            "resolved": resolved_at,
        },
    )
    ev.observe(
        "seconds",
        {
            "stopped_to_condition": _between(stopped, condition_at),
            "aged_to_condition": _between(aged_at, condition_at),
            "condition_to_pending": _between(condition_at, pending),
            "condition_to_firing": _between(condition_at, firing),
            "publisher_ready_to_resolved": _between(ready, resolved_at),
        },
    )
    ev.check("the alert went pending", pending is not None, states[:3])
    ev.check(
        f"firing within for ({for_s:g} s) + 2 scrapes + 1 evaluation ({budget:g} s) "
        "of its condition holding",
        firing is not None and condition_at is not None and firing - condition_at <= budget,
        f"condition {condition_at}, firing {firing}",
    )
    ev.check("resolved after the publisher came back", resolved_at is not None, resolved_at)
    states_end = _wait_all_terminal(ctx, ids, 180)
    ev.check_eq("every export sent while stuck succeeded", states_end, {"succeeded": len(ids)})


def _between(a: float | None, b: float | None) -> float | None:
    return round(b - a, 1) if a is not None and b is not None else None


def recovery_slo_after_kill(ctx: DrillContext) -> None:
    """The runtime kills the bulk worker mid-export (``crictl_stop_worker``); the recovery
    SLO's own series in Prometheus (``exports_recovery_seconds`` of kind lease_expiry, under
    60 s) show that recovery within 90 s of the kill."""
    ev = ctx.ev
    prom = Prometheus()
    base = prom.query('sum(exports_recovery_seconds_count{kind="lease_expiry"})')
    before = float(base[0]["value"][1]) if base else 0.0
    crictl_stop_worker(ctx)
    killed = ev.started + next(t["t"] for t in ev.timeline if t["what"].startswith("crictl stop"))
    fast = 'sum(exports_recovery_seconds_bucket{kind="lease_expiry", le="60.0"})'

    def shown() -> float | None:
        r = prom.query(fast)
        return time.time() if r and float(r[0]["value"][1]) > before else None

    at = None
    with contextlib.suppress(Exception):
        at = wait_for(shown, 120, "Prometheus to show the recovery", interval=0.5)

    def ratio() -> list[dict[str, Any]] | None:
        # the recording rule's next evaluation after the scrape that showed the recovery
        r = prom.query('exports:recovery_slow:ratio_rate5m{kind="lease_expiry"}')
        return r if r and r[0]["value"][1] != "NaN" else None

    slo: list[dict[str, Any]] | None = None
    with contextlib.suppress(Exception):
        slo = wait_for(ratio, 3 * EVALUATION_SECONDS + 5, "the SLO ratio", interval=0.5)
    if slo is None:
        slo = prom.query('exports:recovery_slow:ratio_rate5m{kind="lease_expiry"}')
    ev.observe(
        "prometheus", {"recoveries_within_60s_before": before, "shown_at": at, "slow_ratio_5m": slo}
    )
    ev.check(
        "the recovery SLO series show it within 90 s of the kill",
        at is not None and at - killed <= 90,
        f"killed {killed}, shown {at}",
    )
    ev.check(
        "no slow recovery in the SLO ratio (exports:recovery_slow:ratio_rate5m == 0)",
        bool(slo) and float(slo[0]["value"][1]) == 0.0,
        slo,
    )


def dashboard_panels_answer(ctx: DrillContext) -> None:
    """Every panel query of the chart's dashboards answers from Prometheus. Some panels
    count what only failures make (retries, dead letters, refused submits), which the
    other drills need not cause: they are made here on purpose, each the way a user meets
    it: a transient I/O error in the bulk worker's render (a failpoint in its pod: a retry,
    then success), a permanent one (a dead letter), a submit over a tenant's rate (429).
    Then each ``expr`` of ``files/dashboards`` must answer within a few scrapes (a counter
    first seen at 1 needs two samples for ``rate()``)."""
    env, ev = ctx.env, ctx.ev
    assert isinstance(env, ClusterDrillEnvironment)
    prom = Prometheus()
    pod = running_pod("bulk-worker")["metadata"]["name"]
    env.arm_in_pod(pod, "render.chunk", "io", 1)
    retried = env.db.wait_terminal(ctx.submit(ctx.bulk(), role="retried"), 240)
    ev.check_eq(
        "a transient error: retried, then succeeded",
        (retried["status"], retried["attempts"]),
        ("succeeded", 2),
    )
    env.arm_in_pod(pod, "render.chunk", "permanent", 1)
    dead = env.db.wait_terminal(ctx.submit(ctx.bulk(), role="dead letter"), 240)
    ev.check_eq("a permanent error: failed, a dead letter", dead["status"], "failed")
    limited = env.new_tenant("dashboard-rate")
    env.db.sql(
        "UPDATE tenants SET submit_rate = 0.01, submit_burst = 1 WHERE id = %s", (limited.id,)
    )
    answers = []
    for _ in range(3):
        r = limited.api.submit({"note_ids": limited.note_ids[:1], "format": "json"})
        answers.append(r.status_code)
        if r.status_code == 202:
            ev.track(str(r.json()["id"]), "under the rate")
    ev.check("a submit over the tenant's rate answered 429", 429 in answers, answers)
    # the dispatch-pause panels have series only while a pause is in force: a tenant with
    # no work has its bulk dispatch paused for the check (the recovery-scanner's gauges
    # read the table), and resumed after it
    paused = env.new_tenant("dashboard-pause")
    env.db.sql(
        "INSERT INTO dispatch_pauses (queue, tenant_id, reason, paused_by)"
        " VALUES ('exports.bulk', %s, 'dashboard drill', 'drill')",
        (paused.id,),
    )
    data: dict[str, Any] = {}

    def answered() -> bool:
        data.update(dashboard_data(prom))
        return not data["empty"]

    try:
        with contextlib.suppress(Exception):
            wait_for(
                answered, 6 * SCRAPE_SECONDS + 30, "every dashboard query to answer", interval=2
            )
    finally:
        env.db.sql("DELETE FROM dispatch_pauses WHERE tenant_id = %s", (paused.id,))
    ev.observe("dashboards", {"queries": data.get("queries"), "empty": data.get("empty")})
    ev.check_eq("every panel query answers", data.get("empty"), [])


def export_traces(jaeger: str, job_id: str) -> dict[str, Any]:
    """The traces in Jaeger holding a span with ``job_id`` (searched per service):
    {trace id: Jaeger's trace document}."""
    found: dict[str, Any] = {}
    for service in (
        "notes-exports-api",
        "notes-exports-publisher",
        "notes-exports-worker",
        "notes-exports-recovery-scanner",
    ):
        r = httpx.get(
            f"{jaeger}/api/traces",
            timeout=20,
            params={
                "service": service,
                "tags": json.dumps({"job_id": job_id}),
                "lookback": "2h",
                "limit": "20",
            },
        )
        if r.status_code == 200:
            for trace in r.json().get("data") or []:
                found[trace["traceID"]] = trace
    return found


PLATFORM_DRILLS = {
    "keda_scales_on_backlog": ("KEDA scales fast-worker on the backlog", keda_scales_on_backlog),
    "outbox_stuck_alert": ("the outbox-stuck alert fires and resolves", outbox_stuck_alert),
    "recovery_slo_after_kill": (
        "the recovery SLO shows a killed worker's recovery",
        recovery_slo_after_kill,
    ),
    "dashboard_panels_answer": (
        "every dashboard panel query answers",
        dashboard_panels_answer,
    ),
}


def check_export_trace(
    jaeger: str, job_id: str, *, recovered: bool = False, wait: float = 60.0
) -> dict[str, Any]:
    """One export's trace in Jaeger, checked by :func:`judge_export_trace`, read again every
    2 s until it holds or ``wait`` s have passed: each process sends its spans in batches
    (OpenTelemetry's BatchSpanProcessor, every 5 s by default: ``OTEL_BSP_SCHEDULE_DELAY``),
    so right after an export ends its trace may still lack the worker's or the api's."""
    deadline = time.monotonic() + wait
    while True:
        found = judge_export_trace(job_id, export_traces(jaeger, job_id), recovered=recovered)
        if not found["problems"] or time.monotonic() >= deadline:
            return found
        time.sleep(2)


def judge_export_trace(
    job_id: str, traces: dict[str, Any], *, recovered: bool = False
) -> dict[str, Any]:
    """One export's Jaeger trace documents (``{trace id: document}``), checked: exactly one
    trace holds its spans; it spans the api and the worker, and the publisher unless every
    ``exports.publish`` span of the export was recorded by the worker's claim that took it
    beside another job's message (``dispatched_by`` ``claim``: the publisher never sent it);
    its spans carry job_id, message_id and lease_token; its ``exports.render``,
    ``exports.write`` and ``exports.finish`` spans are children of one of its
    ``exports.claim`` spans, whatever batch it ran in; with ``recovered``, it shows the
    recovery (lease expiry or redispatch) and a claim with another lease token than the
    recovered one (the killed attempt's own claim span may be missing: it was never ended).
    Returns the trace id, its spans (service, name, ids), whether a claim took it
    (``taken_by_claim``) and the problems found (empty: all holds)."""
    problems: list[str] = []
    if len(traces) != 1:
        problems.append(f"{len(traces)} traces hold spans of the export: {sorted(traces)}")
    spans: list[dict[str, Any]] = []
    for trace_id, trace in traces.items():
        for sp in trace["spans"]:
            tags = {t["key"]: t["value"] for t in sp.get("tags", [])}
            parents = [r["spanID"] for r in sp.get("references", []) if r["refType"] == "CHILD_OF"]
            spans.append({
                "trace_id": trace_id,
                "span_id": sp["spanID"],
                "parent_id": parents[0] if parents else None,
                "service": trace["processes"][sp["processID"]]["serviceName"],
                "name": sp["operationName"],
                **{
                    k: tags[k]
                    for k in ("job_id", "message_id", "lease_token", "dispatched_by")
                    if k in tags
                },
            })  # fmt: skip
    services = {s["service"] for s in spans}
    mine = [s for s in spans if s.get("job_id") == job_id]
    publishes = [s for s in mine if s["name"] == "exports.publish"]
    taken = bool(publishes) and all(s.get("dispatched_by") == "claim" for s in publishes)
    wanted = {"notes-exports-api", "notes-exports-worker"}
    if not taken:
        wanted.add("notes-exports-publisher")
    if not wanted <= services:
        problems.append(f"services {sorted(services)} lack {sorted(wanted - services)}")
    if not publishes:
        problems.append("no exports.publish span of the export")
    for attr in ("job_id", "message_id", "lease_token"):
        if not any(attr in s for s in mine):
            problems.append(f"no span of the export carries {attr}")
    claims = [s for s in mine if s["name"] == "exports.claim"]
    claim_ids = {s["span_id"] for s in claims}
    if not claims:
        problems.append("no exports.claim span of the export")
    orphans = sorted({
        s["name"]
        for s in mine
        if s["name"] in ("exports.render", "exports.write", "exports.finish")
        and s["parent_id"] not in claim_ids
    })  # fmt: skip
    if orphans:
        problems.append(f"{orphans} not children of the export's exports.claim span")
    if recovered:
        # The first attempt's claim span encloses its run: a worker killed mid-export (the
        # recovery drill's SIGKILL) never ends it, so it never reaches Jaeger. The recovery
        # span carries the expired lease's token; the claim after it has another one.
        recoveries = [s for s in mine if s["name"].startswith("exports.recovery.")]
        if not recoveries:
            problems.append("no recovery span (lease_expired / redispatch) in the trace")
        expired = {s["lease_token"] for s in recoveries if "lease_token" in s}
        if not [s for s in claims if s.get("lease_token") not in (None, *expired)]:
            problems.append(
                f"no claim after the recovery (a lease token other than {sorted(expired)})"
            )
    return {
        "job_id": job_id,
        "trace_ids": sorted(traces),
        "services": sorted(services),
        "taken_by_claim": taken,
        "spans": spans,
        "problems": problems,
    }
