"""Prometheus metrics: the catalogue every process records into, and how each process
serves it.

Multi-process correctness (gunicorn workers, Celery prefork children, recycled with
``max_tasks_per_child``): when ``PROMETHEUS_MULTIPROC_DIR`` is set *before* this module is
imported, prometheus-client writes every process's values to files in that directory;
:func:`prepare_multiprocess_dir` empties it when the parent process starts, and
:func:`mark_dead` is called when a child exits. Each process kind needs its own directory.

Counters and histograms are recorded where things happen; database-derived gauges (backlog,
ages, expired leases, dead letters, admission usage) are computed at scrape time by
:class:`DatabaseGauges`, and the broker's contents by :class:`BrokerGauges` (from
:class:`exportcore.broker_inspect.BrokerInspector` reports), both registered only by the
recovery-scanner.

Names and labels (stable; dashboards and alert rules in ``charts/notes-exports/files/`` use them):

=========================================  =========  =========================================
metric                                      type       labels
=========================================  =========  =========================================
exports_submits_total                       counter    outcome, source
exports_publishes_total                     counter    outcome, queue
exports_publisher_passes_total              counter    outcome (claimed, held, idle)
exports_publisher_holds_total               counter    queue
exports_claims_total                        counter    outcome, queue
exports_finishes_total                      counter    outcome, queue
exports_retries_total                       counter    error_code, queue
exports_dead_letters_total                  counter    reason
exports_recovery_actions_total              counter    rule
exports_schedule_slots_total                counter    outcome
exports_schedule_pauses_total               counter    reason
exports_schedule_superseded_total           counter    —
exports_tenant_refusals_total               counter    tenant, reason, source
exports_rate_limit_decisions_total          counter    backend, outcome, limit
exports_artifact_missing_total              counter    backend
exports_downstream_throttled_total          counter    target (storage, notes-source)
exports_downstream_wait_seconds             histogram  target
exports_pickup_seconds                      histogram  queue
exports_run_seconds                         histogram  queue, outcome
exports_end_to_end_seconds                  histogram  queue, status
exports_recovery_seconds                    histogram  kind (lease_expiry, lost_dispatch)
exports_scanner_pass_seconds                histogram  —
exports_claim_batch_jobs                    histogram  queue
exports_submit_statement_rows               histogram  —
exports_jobs                                gauge      status, queue
exports_oldest_queued_age_seconds           gauge      queue
exports_outbox_unpublished                  gauge      —
exports_outbox_oldest_age_seconds           gauge      —
exports_expired_leases                      gauge      —
exports_dead_letters                        gauge      reason
exports_admission_active_jobs               gauge      —
exports_admission_capacity                  gauge      —
exports_admission_tenants_at_quota          gauge      —
exports_tenant_jobs                         gauge      tenant, queue, status
exports_tenant_oldest_queued_age_seconds    gauge      tenant, queue
exports_tenant_held_back                    gauge      tenant, queue
exports_outbox_held_back                    gauge      queue
exports_schedules                           gauge      state
exports_schedules_paused                    gauge      reason
exports_dispatch_paused                     gauge      queue, tenant (* : the whole queue)
exports_dispatch_paused_seconds             gauge      queue, tenant
exports_dispatch_paused_waiting             gauge      queue, tenant
exports_dispatch_pause_alert_seconds        gauge      —
exports_db_gauges_up                        gauge      — (0 when the scrape-time queries failed)
exports_webhook_deliveries_total            counter    outcome, event_type
exports_webhook_messages_failed_total       counter    —
exports_webhook_endpoints_disabled_total    counter    reason (failing, gone)
exports_webhook_attempt_seconds             histogram  outcome
exports_webhook_lag_seconds                 histogram  event_type
exports_webhook_messages_pending            gauge      —
exports_webhook_oldest_pending_age_seconds  gauge      —
exports_webhook_endpoints                   gauge      state (closed, circuit_open, disabled)
exports_webhook_longest_failing_seconds     gauge      —
exports_webhook_gauges_up                   gauge      — (0 when the scrape-time query failed)
exports_broker_messages                     gauge      queue, state (ready, unacked)
exports_broker_oldest_age_seconds           gauge      queue, state
exports_broker_oldest_unacked_age_seconds   gauge      —
exports_broker_reconciliation               gauge      queue, kind (stale, unknown, lost…)
exports_broker_up                           gauge      — (0 when the broker inspection failed)
=========================================  =========  =========================================

The ``tenant`` label is bounded (docs/limits.md): the per-tenant gauges label the
``METRICS_TENANT_TOP_N`` tenants furthest behind plus those named in ``METRICS_TENANTS``, and
sum the rest as ``other``; the refusal counter labels only the named ones.
The webhook gauges are computed at scrape time by :class:`WebhookGauges`, registered by the
webhook-delivery process.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    multiprocess,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    # only the report's type: no process imports the kombu-based inspector through here
    from exportcore.broker_inspect import BrokerReport

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
if os.environ.get(MULTIPROC_ENV):
    # Metrics without labels write their file as soon as they are defined (below).
    os.makedirs(os.environ[MULTIPROC_ENV], exist_ok=True)

# Latency buckets in seconds: pickup is milliseconds to a few seconds; runs and end-to-end
# go up to the bulk queue's minutes; recovery is judged against 60 s / 90 s objectives.
FAST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
RUN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800)
RECOVERY_BUCKETS = (1, 5, 10, 15, 20, 30, 45, 60, 75, 90, 120, 180, 300, 600)

HTTP_REQUESTS = Counter(
    "exports_http_requests_total",
    "HTTP requests the api answered, by method, route template (/v1/exports/{job_id}: never "
    "the path a client typed; <unmatched> when no route matched) and status code.",
    ["method", "route", "status"],
)
HTTP_DURATION = Histogram(
    "exports_http_request_duration_seconds",
    "Time from a request's arrival to the end of its answer's start, by method and route template.",
    ["method", "route"],
    buckets=FAST_BUCKETS,
)
SUBMITS = Counter(
    "exports_submits_total",
    "Export submissions by outcome (accepted, idempotent_replay, quota_exceeded, "
    "capacity_exceeded, conflict, invalid) and source (api, replay, schedule).",
    ["outcome", "source"],
)
PUBLISHES = Counter(
    "exports_publishes_total",
    "Outbox events sent to the broker, by outcome (sent, failed).",
    ["outcome", "queue"],
)
PUBLISHER_PASSES = Counter(
    "exports_publisher_passes_total",
    "Publisher passes by outcome: claimed (events claimed, none held back), held (a "
    "tenant's in-flight cap held due events back), idle (nothing due).",
    ["outcome"],
)
for _outcome in ("claimed", "held", "idle"):
    PUBLISHER_PASSES.labels(_outcome)
PUBLISHER_HOLDS = Counter(
    "exports_publisher_holds_total",
    "Publisher passes that left a queue's due events in the outbox because "
    "PUBLISHER_MESSAGES_AHEAD of its messages were already on their way to the workers (the "
    "claim of each of those takes them: the workers are busy, not the publisher stuck).",
    ["queue"],
)
CLAIMS = Counter(
    "exports_claims_total",
    "Message deliveries by claim outcome (claimed, refused_not_due, refused_terminal, "
    "refused_leased, refused_other).",
    ["outcome", "queue"],
)
FINISHES = Counter(
    "exports_finishes_total",
    "Ends of claimed attempts (succeeded, retry, failed, cancelled, lease_lost, finish_refused, "
    "unknown).",
    ["outcome", "queue"],
)
RETRIES = Counter(
    "exports_retries_total",
    "Attempts put back to queued after a transient error.",
    ["error_code", "queue"],
)
DEAD_LETTERS = Counter(
    "exports_dead_letters_total",
    "Jobs that ended failed with a dead letter, by reason.",
    ["reason"],
)
RECOVERY_ACTIONS = Counter(
    "exports_recovery_actions_total", "Changes made by the recovery-scanner, by rule.", ["rule"]
)
SCHEDULE_SLOTS = Counter(
    "exports_schedule_slots_total",
    "Schedule slots handled by the tick (created, skipped for catch-up, overlap: skipped "
    "while an earlier export ran, refused, invalid).",
    ["outcome"],
)
SCHEDULE_PAUSES = Counter(
    "exports_schedule_pauses_total",
    "Schedules the tick paused because their selection can no longer be exported, by reason "
    "(unknown_notes, invalid_selection).",
    ["reason"],
)
SCHEDULE_SUPERSEDED = Counter(
    "exports_schedule_superseded_total",
    "Exports cancelled by a newer slot of their schedule (overlap cancel_other), queued or "
    "running.",
)
TENANT_REFUSALS = Counter(
    "exports_tenant_refusals_total",
    "Submits refused per tenant, by reason (rate_limited, quota_exceeded, capacity_exceeded) "
    "and source (api, schedule). The tenant label is the id only for tenants named in "
    "METRICS_TENANTS (or all with *), else 'other': cardinality stays bounded.",
    ["tenant", "reason", "source"],
)
RATE_LIMIT_DECISIONS = Counter(
    "exports_rate_limit_decisions_total",
    "Rate-limit decisions by backend (redis: the shared buckets; local: the process's "
    "fallback bucket while Redis is unreachable), outcome (allowed, limited) and limit "
    "(submit, read, webhook-action, console-sign-in; the workers' storage and notes-source "
    "downstream limits).",
    ["backend", "outcome", "limit"],
)
# Series that exist from the start (at 0), so that rates and alerts see "none yet" rather
# than "no data" (Prometheus practice: initialise label sets that are known in advance).
for _reason, _source in (
    ("rate_limited", "api"),
    ("quota_exceeded", "api"),
    ("capacity_exceeded", "api"),
    ("quota_exceeded", "schedule"),
    ("capacity_exceeded", "schedule"),
):
    TENANT_REFUSALS.labels("other", _reason, _source)
for _backend in ("redis", "local"):
    for _outcome in ("allowed", "limited"):
        RATE_LIMIT_DECISIONS.labels(_backend, _outcome, "submit")
DOWNSTREAM_WAIT = Histogram(
    "exports_downstream_wait_seconds",
    "Time a worker's call to the object store (storage) or the notes source (notes-source) "
    "waited for a token of the deployment's downstream rate limit (only calls that waited).",
    ["target"],
    buckets=FAST_BUCKETS,
)
DOWNSTREAM_THROTTLED = Counter(
    "exports_downstream_throttled_total",
    "Downstream calls that got no token within DOWNSTREAM_MAX_WAIT_SECONDS or before the "
    "job's deadline (the attempt failed as downstream_throttled and is retried).",
    ["target"],
)
for _target in ("storage", "notes-source"):
    DOWNSTREAM_THROTTLED.labels(_target)
ARTIFACT_MISSING = Counter(
    "exports_artifact_missing_total",
    "Downloads of a succeeded export whose file was gone (410), by storage backend.",
    ["backend"],
)
CHECKPOINTS_RESUMED = Counter(
    "exports_checkpoints_resumed_total",
    "Bulk renders that took over a checkpoint and went on from it, by storage backend.",
    ["backend"],
)
CHECKPOINTS_DISCARDED = Counter(
    "exports_checkpoints_discarded_total",
    "Checkpoints that could not be trusted and were discarded (the export started over), "
    "by reason (missing, short, hash_mismatch, layout, segments; encrypted: an encrypted "
    "export never resumes).",
    ["reason"],
)
NOTES_CARRIED = Counter(
    "exports_checkpoint_notes_carried_total",
    "Notes a takeover did not render again (carried over from a checkpoint).",
)
PICKUP = Histogram(
    "exports_pickup_seconds", "Submit to first claim, seconds.", ["queue"], buckets=FAST_BUCKETS
)
CLAIM_BATCH = Histogram(
    "exports_claim_batch_jobs",
    "Jobs one worker claim took: its message's and those it took from the outbox beside it.",
    ["queue"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 100),
)
SUBMIT_STATEMENT_ROWS = Histogram(
    "exports_submit_statement_rows",
    "Submits one statement of an api process wrote (its submit coalescer; 1: alone).",
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
)
RUN = Histogram(
    "exports_run_seconds",
    "Claim to the end of the attempt, seconds.",
    ["queue", "outcome"],
    buckets=RUN_BUCKETS,
)
END_TO_END = Histogram(
    "exports_end_to_end_seconds",
    "Submit to a terminal state, seconds.",
    ["queue", "status"],
    buckets=RUN_BUCKETS,
)
RECOVERY = Histogram(
    "exports_recovery_seconds",
    "Lease expiry (lease_expiry) or last dispatch of a lost message (lost_dispatch) to the "
    "job being claimed again, seconds.",
    ["kind"],
    buckets=RECOVERY_BUCKETS,
)
#: the recovery kinds a job row records (jobs.sql: settle and redispatch)
RECOVERY_KINDS = ("lease_expiry", "lost_dispatch")
WEBHOOK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 21600, 86400)
WEBHOOK_DELIVERIES = Counter(
    "exports_webhook_deliveries_total",
    "Webhook attempts by outcome (delivered, http_error, redirect, gone, timeout, "
    "connection_error, refused) and event type.",
    ["outcome", "event_type"],
)
WEBHOOK_MESSAGES_FAILED = Counter(
    "exports_webhook_messages_failed_total",
    "Webhook messages given up: no attempt left, or the receiver answered 410 Gone.",
)
WEBHOOK_ENDPOINTS_DISABLED = Counter(
    "exports_webhook_endpoints_disabled_total",
    "Webhook endpoints disabled by the delivery process, by reason (failing, gone).",
    ["reason"],
)
WEBHOOK_ATTEMPT_SECONDS = Histogram(
    "exports_webhook_attempt_seconds",
    "Duration of one webhook attempt (request sent to answer or error), seconds.",
    ["outcome"],
    buckets=WEBHOOK_BUCKETS,
)
WEBHOOK_LAG = Histogram(
    "exports_webhook_lag_seconds",
    "Webhook message written (the state change committed) to its successful delivery, seconds.",
    ["event_type"],
    buckets=LAG_BUCKETS,
)
SCANNER_PASS = Histogram(
    "exports_scanner_pass_seconds",
    "Duration of one recovery-scanner pass, seconds.",
    buckets=FAST_BUCKETS,
)


def init_worker_series() -> None:
    """Create the worker's recovery series at 0 (``exports_recovery_seconds`` of each kind
    of :data:`RECOVERY_KINDS`), in the process that serves /metrics. Without them the first
    recovery after a worker starts makes its series appear already at 1, and ``rate()`` /
    ``increase()`` (the recovery SLO rules and panels) never see that increase: a first
    sample has no predecessor. Prometheus practice: "Avoid missing metrics"
    (prometheus.io/docs/practices/instrumentation)."""
    for kind in RECOVERY_KINDS:
        RECOVERY.labels(kind)


def init_webhook_series(outcomes: Iterable[str], event_types: Iterable[str]) -> None:
    """Create the webhook-delivery process's series at 0 for every known ``outcomes`` x
    ``event_types`` (strings; ``webhooks.policy.OUTCOMES``, ``webhooks.events`` types), so
    that the dashboards' webhook panels and ``rate()`` see "none yet", and a first
    delivery's increase, rather than no data (see :func:`init_worker_series`)."""
    types = tuple(event_types)
    for outcome in outcomes:
        WEBHOOK_ATTEMPT_SECONDS.labels(outcome)
        for event_type in types:
            WEBHOOK_DELIVERIES.labels(outcome, event_type)
    for event_type in types:
        WEBHOOK_LAG.labels(event_type)


def prepare_multiprocess_dir() -> Path | None:
    """Remove what earlier runs left in ``PROMETHEUS_MULTIPROC_DIR`` (every file but this
    process's own) — call once in the parent process before any child starts. Returns the
    directory, or None when not in multi-process mode."""
    raw = os.environ.get(MULTIPROC_ENV)
    if not raw:
        return None
    path = Path(raw)
    path.mkdir(parents=True, exist_ok=True)
    mine = f"_{os.getpid()}.db"
    for entry in path.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        elif not entry.name.endswith(mine):
            entry.unlink(missing_ok=True)
    return path


def mark_dead(pid: int) -> None:
    """Tell multi-process mode that ``pid`` exited (its live gauges disappear)."""
    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def registry(extra: Collector | None = None) -> CollectorRegistry:
    """The registry to expose: every process's values in multi-process mode, else this
    process's; plus ``extra`` (the database gauges) when given."""
    if os.environ.get(MULTIPROC_ENV):
        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg)  # type: ignore[no-untyped-call]
    else:
        reg = REGISTRY
    if extra is not None:
        reg.register(extra)
    return reg


def serve(port: int, addr: str, extra: Collector | None = None) -> None:
    """Serve ``/metrics`` on ``addr:port`` from a background thread (port 0 disables).

    ``addr`` is the deployment's choice (``METRICS_BIND_ADDRESS``: loopback by default, the
    pod's addresses in the chart); metrics never share the api's public port. Raises
    OSError when the address cannot be bound."""
    if port <= 0:
        return
    start_http_server(port, addr=addr, registry=registry(extra))
    log.info("metrics served", extra={"port": port, "address": addr})


class DatabaseGauges(Collector):
    """Gauges computed from PostgreSQL at scrape time, with a short statement timeout.

    ``query`` is a callable returning the rows of ``sql/metrics.sql``'s ``metrics_snapshot``;
    when it fails the scrape still answers, with ``exports_db_gauges_up 0``.
    """

    def __init__(self, query: Any) -> None:
        self.query = query

    def describe(self) -> Iterator[Metric]:
        return iter(())

    up_name = "exports_db_gauges_up"
    up_help = "1 when the scrape-time database queries succeeded."
    what = "database gauges"

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(self.up_name, self.up_help)
        try:
            snapshot = self.query()
        except Exception as exc:
            log.warning(f"{self.what} unavailable", extra={"error": type(exc).__name__})
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from self.families(snapshot)

    def families(self, snapshot: dict[str, Any]) -> Iterator[Metric]:
        """The gauge families of one successful query result."""
        return snapshot_families(snapshot)


def snapshot_families(s: dict[str, Any]) -> Iterator[Metric]:
    """Gauge families from a database snapshot (see ``exportcore.store.metrics``)."""
    jobs = GaugeMetricFamily(
        "exports_jobs", "Jobs by status and queue.", labels=["status", "queue"]
    )
    for (status, queue), n in sorted(s["jobs"].items()):
        jobs.add_metric([status, queue], n)
    yield jobs
    oldest = GaugeMetricFamily(
        "exports_oldest_queued_age_seconds",
        "Age of the oldest due queued job by queue that no dispatch pause holds, seconds (0 when "
        "none).",
        labels=["queue"],
    )
    for queue, age in sorted(s["oldest_queued"].items()):
        oldest.add_metric([queue], age)
    yield oldest
    yield GaugeMetricFamily(
        "exports_outbox_unpublished", "Outbox events not yet sent.", value=s["outbox_unpublished"]
    )
    yield GaugeMetricFamily(
        "exports_outbox_oldest_age_seconds",
        "Age of the oldest due, unsent outbox event that no dispatch pause holds, seconds (0 when "
        "none).",
        value=s["outbox_oldest_age"],
    )
    yield GaugeMetricFamily(
        "exports_expired_leases", "Running jobs whose lease has expired.", value=s["expired_leases"]
    )
    dead = GaugeMetricFamily("exports_dead_letters", "Dead letters by reason.", labels=["reason"])
    for reason, n in sorted(s["dead_letters"].items()):
        dead.add_metric([reason], n)
    yield dead
    yield GaugeMetricFamily(
        "exports_admission_active_jobs",
        "Active (queued + running) jobs, as admission counts them.",
        value=s["admission_active"],
    )
    yield GaugeMetricFamily(
        "exports_admission_capacity",
        "Global capacity of active jobs.",
        value=s["admission_capacity"],
    )
    yield GaugeMetricFamily(
        "exports_admission_tenants_at_quota",
        "Tenants whose active jobs reached their quota.",
        value=s["tenants_at_quota"],
    )
    yield from tenant_families(s)
    yield from pause_families(s)


ALL_TENANTS = "*"
"""The ``tenant`` label of a pause of a whole queue."""


def pause_families(s: dict[str, Any]) -> Iterator[Metric]:
    """The dispatch pauses in force (``exportcore.pauses``): one series per pause, labelled
    by its queue and tenant (``*`` for the whole queue; pauses are few, made by operators),
    and the setting the forgotten-pause alert compares their age with. A pause's work is
    left out of the backlog and outbox ages, so these are how the alerts and dashboards
    tell a pause from a fault."""
    paused = GaugeMetricFamily(
        "exports_dispatch_paused",
        "1 per dispatch pause in force, by queue and tenant (* : the whole queue).",
        labels=["queue", "tenant"],
    )
    seconds = GaugeMetricFamily(
        "exports_dispatch_paused_seconds",
        "How long each dispatch pause in force has lasted, seconds.",
        labels=["queue", "tenant"],
    )
    waiting = GaugeMetricFamily(
        "exports_dispatch_paused_waiting",
        "Pending outbox events waiting behind each dispatch pause.",
        labels=["queue", "tenant"],
    )
    for p in s.get("dispatch_pauses", []):
        labels = [p["queue"], p["tenant_id"] or ALL_TENANTS]
        paused.add_metric(labels, 1)
        seconds.add_metric(labels, max(0.0, float(p["paused_seconds"])))
        waiting.add_metric(labels, int(p["waiting"]))
    yield paused
    yield seconds
    yield waiting
    yield GaugeMetricFamily(
        "exports_dispatch_pause_alert_seconds",
        "DISPATCH_PAUSE_ALERT_SECONDS: a pause on longer than this fires "
        "NotesExportsDispatchPausedTooLong.",
        value=s.get("pause_alert_seconds", 14400.0),
    )


def tenant_families(s: dict[str, Any]) -> Iterator[Metric]:
    """Per-tenant backlog gauges (bounded labels: METRICS_TENANT_TOP_N furthest behind plus
    METRICS_TENANTS, the rest as tenant="other") and schedule states."""
    jobs = GaugeMetricFamily(
        "exports_tenant_jobs",
        "Active jobs per tenant (top N + named + other) by queue and status.",
        labels=["tenant", "queue", "status"],
    )
    oldest = GaugeMetricFamily(
        "exports_tenant_oldest_queued_age_seconds",
        "Age of the tenant's oldest due queued job by queue, seconds (0 when none, or while its "
        "dispatch is paused).",
        labels=["tenant", "queue"],
    )
    held = GaugeMetricFamily(
        "exports_tenant_held_back",
        "Due outbox events of the tenant (top N + named + other) that its in-flight cap "
        "holds back, by queue (fair dispatch: they go as its running jobs end).",
        labels=["tenant", "queue"],
    )
    for (tenant, queue), v in sorted(s.get("tenant_backlog", {}).items()):
        jobs.add_metric([tenant, queue, "queued"], v["queued"])
        jobs.add_metric([tenant, queue, "running"], v["running"])
        oldest.add_metric([tenant, queue], v["oldest_age"])
        held.add_metric([tenant, queue], v.get("held_back", 0.0))
    yield jobs
    yield oldest
    yield held
    queue_held = GaugeMetricFamily(
        "exports_outbox_held_back",
        "Due outbox events held back by their tenants' in-flight caps, by queue.",
        labels=["queue"],
    )
    for queue, n in sorted(s.get("held_back", {}).items()):
        queue_held.add_metric([queue], n)
    yield queue_held
    states = GaugeMetricFamily(
        "exports_schedules",
        "Schedules by state: enabled, backing_off (enabled, waiting after a refusal), paused.",
        labels=["state"],
    )
    counts = s.get("schedules", {})
    paused = s.get("schedules_paused", {})
    states.add_metric(["enabled"], counts.get("enabled", 0))
    states.add_metric(["backing_off"], counts.get("backing_off", 0))
    states.add_metric(["paused"], sum(paused.values()))
    yield states
    by_reason = GaugeMetricFamily(
        "exports_schedules_paused",
        "Paused schedules by reason (requested, unknown_notes, invalid_selection).",
        labels=["reason"],
    )
    for reason in sorted({"requested", "unknown_notes", "invalid_selection", *paused}):
        by_reason.add_metric([reason], paused.get(reason, 0))
    yield by_reason


class WebhookGauges(DatabaseGauges):
    """Webhook gauges computed from PostgreSQL at scrape time (backlog, its age, endpoints by
    state, the longest current failure run). ``query`` returns the row of
    ``sql/webhook_messages.sql``'s ``webhook_message_gauges``; when it fails the scrape still
    answers, with ``exports_webhook_gauges_up 0``."""

    up_name = "exports_webhook_gauges_up"
    up_help = "1 when the scrape-time webhook query succeeded."
    what = "webhook gauges"

    def families(self, row: dict[str, Any]) -> Iterator[Metric]:
        """The webhook gauge families of the ``webhook_message_gauges`` row."""
        yield GaugeMetricFamily(
            "exports_webhook_messages_pending",
            "Webhook messages not yet delivered or given up.",
            value=row["pending"],
        )
        yield GaugeMetricFamily(
            "exports_webhook_oldest_pending_age_seconds",
            "Age of the oldest pending message of an enabled endpoint, seconds (0 when none).",
            value=row["oldest_pending_age"],
        )
        states = GaugeMetricFamily(
            "exports_webhook_endpoints", "Webhook endpoints by state.", labels=["state"]
        )
        for state in ("closed", "circuit_open", "disabled"):
            states.add_metric([state], row[state])
        yield states
        yield GaugeMetricFamily(
            "exports_webhook_longest_failing_seconds",
            "How long the enabled endpoint failing the longest has failed without a success, "
            "seconds (0 when none fails).",
            value=row["longest_failing"],
        )


class Inspector(Protocol):
    """What :class:`BrokerGauges` needs of an
    :class:`exportcore.broker_inspect.BrokerInspector`."""

    def inspect(self) -> BrokerReport:
        """One read-only inspection of the broker."""
        ...


class BrokerGauges(Collector):
    """``exports_broker_*`` gauges from an inspection
    (:class:`exportcore.broker_inspect.BrokerInspector`) run every ``interval`` seconds on a
    background thread (:meth:`start`), not at scrape time: a scrape costs nothing however
    often Prometheus (or several) scrapes, and the inspection's Redis and PostgreSQL reads
    are bounded to one per interval. ``exports_broker_up`` is 0 until the first inspection,
    and whenever the last one failed (then no other family is served);
    ``exports_broker_report_age_seconds`` says how old the served figures are.
    """

    def __init__(self, inspector: Inspector, interval: float = 15.0) -> None:
        self.inspector = inspector
        self.interval = interval
        self._lock = threading.Lock()
        self._report: BrokerReport | None = None
        self._at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> bool:
        """Inspect once (read-only) and keep the result; False when it failed."""
        try:
            report = self.inspector.inspect()
        except Exception as exc:
            log.warning("broker gauges unavailable", extra={"error": type(exc).__name__})
            with self._lock:
                self._report = None
            return False
        with self._lock:
            self._report, self._at = report, time.monotonic()
        return True

    def start(self) -> BrokerGauges:
        """Refresh every ``interval`` seconds on a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="broker-gauges", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the refresh thread (waits for a refresh in progress, a few seconds at most)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.interval)

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            report, at = self._report, self._at
        up = GaugeMetricFamily("exports_broker_up", "1 when the last broker inspection succeeded.")
        up.add_metric([], 1 if report is not None else 0)
        yield up
        if report is None:
            return
        yield GaugeMetricFamily(
            "exports_broker_report_age_seconds",
            "Seconds since the broker inspection these exports_broker_* figures come from.",
            value=time.monotonic() - at,
        )
        yield from broker_families(report)


def broker_families(report: BrokerReport) -> Iterator[Metric]:
    """Gauge families of an :class:`exportcore.broker_inspect.BrokerReport`."""
    messages = GaugeMetricFamily(
        "exports_broker_messages",
        "Messages in Redis by queue and state (ready: waiting; unacked: delivered to a "
        "worker, not acknowledged).",
        labels=["queue", "state"],
    )
    ages = GaugeMetricFamily(
        "exports_broker_oldest_age_seconds",
        "Age of the oldest message by queue and state, seconds (ready: since sent; "
        "unacked: since delivered; 0 when none).",
        labels=["queue", "state"],
    )
    recon = GaugeMetricFamily(
        "exports_broker_reconciliation",
        "Broker vs PostgreSQL by queue: stale (messages of terminal jobs), unknown "
        "(messages of no job), unreadable, lost (queued jobs with no message and no "
        "unsent outbox event).",
        labels=["queue", "kind"],
    )
    for name, q in sorted(report.queues.items()):
        messages.add_metric([name, "ready"], q.ready)
        messages.add_metric([name, "unacked"], q.unacked)
        ages.add_metric([name, "ready"], q.oldest_ready_age or 0.0)
        ages.add_metric([name, "unacked"], q.oldest_unacked_age or 0.0)
        for kind in ("stale", "unknown", "unreadable", "lost"):
            recon.add_metric([name, kind], getattr(q, kind))
    yield messages
    yield ages
    yield recon
    yield GaugeMetricFamily(
        "exports_broker_oldest_unacked_age_seconds",
        "Age of the oldest unacknowledged message of any queue, seconds (0 when none).",
        value=report.oldest_unacked_age or 0.0,
    )


class CollectorGroup(Collector):
    """Several scrape-time collectors served as one ``extra`` (see :func:`serve`)."""

    def __init__(self, *collectors: Collector) -> None:
        self.collectors = collectors

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        for collector in self.collectors:
            yield from collector.collect()
