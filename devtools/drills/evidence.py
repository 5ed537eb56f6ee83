"""Evidence records: what a drill observed, the checks made on it, and its verdict; and
how it is observed: the workers' log lines (:class:`LogIndex`), the polled job states
(:class:`JobWatcher`), each tracked job read back at the end (:func:`collect`) and the
invariants checked on every job (:func:`check_job_invariants`).

A drill is marked passed only when it made at least one check and every check held; each
check is computed from something observed on the running system (database rows, history
events, worker logs, HTTP answers, artifacts read back through the store), never from what
the drill expected to happen. An exception inside a drill fails it with the exception as
the reason.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from devtools.drills.background import BackgroundLoop
from exportcore.domain import ArtifactMissing

if TYPE_CHECKING:
    from devtools.drills.harness import DrillEnvironment


def now_iso(ts: float | None = None) -> str:
    """ISO 8601 UTC of a Unix time (default now), milliseconds."""
    return datetime.fromtimestamp(time.time() if ts is None else ts, tz=UTC).isoformat(
        timespec="milliseconds"
    )


def jsonable(value: Any) -> Any:
    """``value`` with datetimes, UUIDs, paths and sets made JSON-friendly."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [jsonable(v) for v in value]
        return sorted(items, key=str) if isinstance(value, set | frozenset) else items
    if isinstance(value, datetime):
        return value.isoformat(timespec="milliseconds")
    if isinstance(value, float):
        return round(value, 4)
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


@dataclass
class Check:
    """One observed fact compared with what the system promises."""

    name: str
    ok: bool
    detail: str = ""


@dataclass
class JobEvidence:
    """What was observed of one job."""

    job_id: str
    role: str
    status: str | None = None
    queue: str | None = None
    attempts: int | None = None
    max_attempts: int | None = None
    dispatch_count: int | None = None
    error_code: str | None = None
    message_ids: list[dict[str, Any]] = field(default_factory=list)
    lease_tokens: list[str] = field(default_factory=list)
    observed_states: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    state_sequence: list[str] = field(default_factory=list)
    claim_refusals: list[dict[str, Any]] = field(default_factory=list)
    succeeded_events: int = 0
    result_ref: str | None = None
    stored_sha256: str | None = None
    artifact_sha256: str | None = None
    artifact_bytes: int | None = None
    artifact_error: str | None = None
    dead_letter: dict[str, Any] | None = None


class Evidence:
    """The record of one drill run; written as ``<out>/<drill>.json``."""

    def __init__(self, name: str, title: str, group: str, matrix_row: str | None) -> None:
        self.name = name
        self.title = title
        self.group = group
        self.matrix_row = matrix_row
        self.started = time.time()
        self.finished: float | None = None
        self.settings: dict[str, Any] = {}
        self.budgets: dict[str, float] = {}
        self.fault: dict[str, Any] = {}
        self.timeline: list[dict[str, Any]] = []
        self.tracked: dict[str, str] = {}
        self.jobs: dict[str, JobEvidence] = {}
        self.recovery_seconds: dict[str, float | None] = {}
        self.duplicate_deliveries: dict[str, Any] = {}
        self.observations: dict[str, Any] = {}
        self.checks: list[Check] = []
        self.passed = False
        self.skipped: str | None = None
        self.reason = "not run"
        self.error: str | None = None

    # --- recording --------------------------------------------------------------------------

    def note(self, what: str, **details: Any) -> float:
        """Add a timestamped step to the timeline; returns its Unix time."""
        ts = time.time()
        self.timeline.append({"at": now_iso(ts), "t": round(ts - self.started, 3), "what": what})
        if details:
            self.timeline[-1].update(jsonable(details))
        return ts

    def track(self, job_id: Any, role: str) -> str:
        """Collect full evidence for ``job_id`` at the end of the drill."""
        key = str(job_id)
        self.tracked.setdefault(key, role)
        return key

    def observe(self, key: str, value: Any) -> Any:
        """Store an observed value under ``observations[key]``; returns it."""
        self.observations[key] = jsonable(value)
        return value

    def check(self, name: str, ok: bool, detail: Any = "") -> bool:
        """Record one check; returns ``ok``."""
        self.checks.append(Check(name, bool(ok), str(detail)[:2000]))
        return bool(ok)

    def check_eq(self, name: str, actual: Any, expected: Any) -> bool:
        """Check ``actual == expected`` and record both."""
        return self.check(
            name,
            actual == expected,
            f"observed {jsonable(actual)}, expected {jsonable(expected)}",
        )

    def check_le(self, name: str, measured: float | None, budget: float) -> bool:
        """Check a measured duration against a budget (seconds)."""
        if measured is None:
            return self.check(name, False, f"not measured (budget {budget:.2f} s)")
        return self.check(
            name, measured <= budget, f"measured {measured:.2f} s, budget {budget:.2f} s"
        )

    def skip(self, why: str) -> None:
        """Mark the drill as not runnable here (never counts as passed)."""
        self.skipped = why

    # --- verdict ----------------------------------------------------------------------------

    def finish(self, error: BaseException | None = None) -> None:
        """Decide pass/fail from the checks (and an exception, if one ended the drill)."""
        self.finished = time.time()
        failed = [c for c in self.checks if not c.ok]
        if error is not None:
            self.error = "".join(traceback.format_exception(error))[-4000:]
            self.passed = False
            self.reason = f"{type(error).__name__}: {error}"
        elif self.skipped:
            self.passed = False
            self.reason = f"skipped: {self.skipped}"
        elif not self.checks:
            self.passed = False
            self.reason = "no check was made: nothing observed"
        elif failed:
            self.passed = False
            self.reason = "; ".join(f"{c.name}: {c.detail}" for c in failed[:5])
        else:
            self.passed = True
            self.reason = f"all {len(self.checks)} checks held on observed evidence"

    @property
    def verdict(self) -> str:
        """``passed``, ``failed`` or ``skipped``."""
        if self.skipped and self.error is None:
            return "skipped"
        return "passed" if self.passed else "failed"

    @property
    def seconds(self) -> float:
        """Wall time of the drill."""
        return (self.finished or time.time()) - self.started

    def as_dict(self) -> dict[str, Any]:
        """The JSON document of the evidence file."""
        doc: dict[str, Any] = jsonable(
            {
                "drill": self.name,
                "title": self.title,
                "group": self.group,
                "matrix_row": self.matrix_row,
                "verdict": self.verdict,
                "passed": self.passed,
                "reason": self.reason,
                "started_at": now_iso(self.started),
                "finished_at": now_iso(self.finished) if self.finished else None,
                "seconds": round(self.seconds, 3),
                "settings": self.settings,
                "budgets": self.budgets,
                "fault": self.fault,
                "job_ids": list(self.tracked),
                "message_ids": sorted({m["id"] for j in self.jobs.values() for m in j.message_ids}),
                "lease_tokens": sorted({t for j in self.jobs.values() for t in j.lease_tokens}),
                "recovery_seconds": self.recovery_seconds,
                "duplicate_deliveries": self.duplicate_deliveries,
                "checks": [asdict(c) for c in self.checks],
                "observations": self.observations,
                "timeline": self.timeline,
                "jobs": [asdict(j) for j in self.jobs.values()],
                "error": self.error,
            }
        )
        return doc

    def write(self, out_dir: Path) -> Path:
        """Write ``<out_dir>/<drill>.json``; returns the path."""
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{self.name}.json"
        path.write_text(json.dumps(self.as_dict(), indent=2, ensure_ascii=False) + "\n")
        return path


# --- observing ------------------------------------------------------------------------------


class LogIndex:
    """Incremental reader of the JSON log lines of some processes, indexed by job id."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths
        self.offsets = dict.fromkeys(paths, 0)
        self.tails = dict.fromkeys(paths, b"")
        self.by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Read what was appended since the last call."""
        with self._lock:
            for name, path in self.paths.items():
                if not path.exists():
                    continue
                with open(path, "rb") as fh:
                    fh.seek(self.offsets[name])
                    data = self.tails[name] + fh.read()
                    self.offsets[name] = fh.tell()
                lines = data.split(b"\n")
                self.tails[name] = lines.pop()
                for line in lines:
                    if not line.startswith(b"{"):
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    record["process"] = name
                    self.records.append(record)
                    if record.get("job_id"):
                        self.by_job[str(record["job_id"])].append(record)

    def for_job(self, job_id: str) -> list[dict[str, Any]]:
        """Records that carry ``job_id``, in file order per process."""
        return list(self.by_job.get(str(job_id), []))

    def matching(self, message: str) -> list[dict[str, Any]]:
        """Records whose message is ``message``."""
        return [r for r in self.records if r.get("message") == message]

    def refusals(self, job_id: str) -> list[dict[str, Any]]:
        """Claim refusals the workers logged for ``job_id`` (duplicate or early deliveries),
        read up to now."""
        self.refresh()
        return [r for r in self.for_job(job_id) if r.get("message") == "claim refused"]


class JobWatcher(BackgroundLoop):
    """Polls the jobs of one tenant and records every observed change of (status, attempts,
    lease token) with its time: the polled half of a job's observed state sequence (the
    other half is its history in ``export_job_events``)."""

    name = "job-watcher"
    join_timeout = 10.0

    def __init__(self, env: DrillEnvironment, tenant_id: str, interval: float = 0.05) -> None:
        self.env = env
        self.tenant_id = tenant_id
        self.interval = interval
        self.observed: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.gaps: list[dict[str, Any]] = []
        self._last: dict[str, tuple[Any, ...]] = {}
        super().__init__()

    def stop(self) -> None:
        """Stop polling (after one last poll)."""
        super().stop()
        with contextlib.suppress(Exception):
            self.poll()

    def _run(self) -> None:
        down_since: float | None = None
        while not self._stop.is_set():
            try:
                self.poll()
                if down_since is not None:
                    self.gaps.append({"from": now_iso(down_since), "to": now_iso()})
                    down_since = None
            except psycopg.Error:
                if down_since is None:
                    down_since = time.time()
            self._stop.wait(self.interval)

    watermark_overlap = 5.0

    def poll(self) -> None:
        """One poll: rows of the tenant updated in the last few seconds."""
        rows = self.env.db.sql(
            "SELECT id, status, attempts, lease_token, now() AS db_now FROM export_jobs"
            " WHERE tenant_id = %s AND updated_at >= coalesce(%s, '-infinity'::timestamptz)",
            (self.tenant_id, getattr(self, "_watermark", None)),
        )
        seen = now_iso()
        for row in rows:
            job_id = str(row["id"])
            state = (row["status"], row["attempts"], row["lease_token"])
            if self._last.get(job_id) != state:
                self._last[job_id] = state
                self.observed[job_id].append(
                    {
                        "at": seen,
                        "status": row["status"],
                        "attempts": row["attempts"],
                        "lease_token": str(row["lease_token"]) if row["lease_token"] else None,
                    }
                )
        if rows:
            self._watermark = rows[0]["db_now"] - timedelta(seconds=self.watermark_overlap)


def read_job(
    env: DrillEnvironment, job_id: str, role: str, watcher: JobWatcher | None = None
) -> JobEvidence:
    """Everything observable about one job, read back now from ``env``: its row, history,
    outbox events, the states ``watcher`` polled, the claim refusals the workers logged,
    its artifact read back through the store (SHA-256, size) and its dead letter."""
    ev = JobEvidence(job_id=job_id, role=role)
    rows = env.db.sql("SELECT * FROM export_jobs WHERE id = %s", (job_id,))
    if not rows:
        ev.status = "<missing>"
        return ev
    row = rows[0]
    ev.status, ev.queue, ev.attempts = row["status"], row["queue"], row["attempts"]
    ev.max_attempts, ev.dispatch_count = row["max_attempts"], row["dispatch_count"]
    ev.error_code, ev.result_ref, ev.stored_sha256 = (
        row["error_code"],
        row["result_ref"],
        row["result_sha256"],
    )
    history = env.db.history(job_id)
    ev.history = [jsonable({k: v for k, v in e.items() if k != "id"}) for e in history]
    ev.lease_tokens = [str(e["lease_token"]) for e in history if e["kind"] == "claimed"]
    ev.succeeded_events = sum(e["kind"] == "succeeded" for e in history)
    sequence: list[str] = []
    for e in history:
        if e["to_status"] and (not sequence or sequence[-1] != e["to_status"]):
            sequence.append(e["to_status"])
    ev.state_sequence = sequence
    ev.message_ids = [
        jsonable(
            {
                "id": o["id"],
                "reason": o["reason"],
                "sent_at": o["sent_at"],
                "publish_attempts": o["publish_attempts"],
                "last_error": o["last_error"],
            }
        )
        for o in env.db.outbox(job_id)
    ]
    if watcher is not None:
        ev.observed_states = watcher.observed.get(job_id, [])
    ev.claim_refusals = [
        {"ts": r.get("ts"), "reason": r.get("reason"), "message_id": r.get("message_id")}
        for r in env.logs.refusals(job_id)
    ]
    if row["result_ref"]:
        try:
            ev.artifact_sha256, ev.artifact_bytes = env.read_artifact(row["result_ref"])
        except (ArtifactMissing, OSError) as exc:
            ev.artifact_error = f"{type(exc).__name__}: {exc}"
    dead = env.db.sql(
        "SELECT reason, attempts, created_at FROM export_dead_letters WHERE job_id = %s",
        (job_id,),
    )
    ev.dead_letter = jsonable(dead[0]) if dead else None
    return ev


def collect(
    env: DrillEnvironment, ev: Evidence, watcher: JobWatcher | None = None, readers: int = 1
) -> None:
    """Read back every tracked job of ``ev`` (on ``readers`` threads, each with its own
    connection: a rollout under load tracks hundreds of jobs) and check the invariants that
    hold for any job."""
    env.logs.refresh()
    items = list(ev.tracked.items())

    def read(item: tuple[str, str]) -> JobEvidence:
        return read_job(env, item[0], item[1], watcher)

    if readers > 1:
        with ThreadPoolExecutor(max_workers=readers) as pool:
            ev.jobs.update(zip([k for k, _ in items], pool.map(read, items), strict=True))
    else:
        for item in items:
            ev.jobs[item[0]] = read(item)
    jobs = list(ev.jobs.values())
    reasons: dict[str, int] = defaultdict(int)
    for j in jobs:
        for r in j.claim_refusals:
            reasons[str(r.get("reason"))] += 1
    ev.duplicate_deliveries.setdefault("claim_refusals_total", sum(reasons.values()))
    ev.duplicate_deliveries.setdefault("claim_refusals_by_reason", dict(reasons))
    ev.duplicate_deliveries.setdefault(
        "dispatch_counts", {j.job_id: j.dispatch_count for j in jobs[:50]}
    )
    check_job_invariants(ev, jobs)


def check_job_invariants(ev: Evidence, jobs: Sequence[JobEvidence]) -> None:
    """Checks every drill makes on every job it touched."""
    if not jobs:
        return
    missing = [j.job_id for j in jobs if j.status == "<missing>"]
    ev.check("invariant: every tracked job exists", not missing, f"missing: {missing[:10]}")
    twice = [j.job_id for j in jobs if j.succeeded_events > 1]
    ev.check("invariant: no job has two succeeded events", not twice, f"jobs: {twice[:10]}")
    over = [
        j.job_id
        for j in jobs
        if j.attempts is not None
        and j.max_attempts is not None
        and (j.attempts > j.max_attempts or len(j.lease_tokens) > j.max_attempts)
    ]
    ev.check("invariant: attempts never exceed the maximum", not over, f"jobs: {over[:10]}")
    bad_artifacts = [
        f"{j.job_id}: {j.artifact_error or 'sha256 mismatch'}"
        for j in jobs
        if j.status == "succeeded"
        and (j.artifact_error or not j.artifact_sha256 or j.artifact_sha256 != j.stored_sha256)
    ]
    ev.check(
        "invariant: every succeeded job has a readable artifact with its recorded sha256",
        not bad_artifacts,
        "; ".join(bad_artifacts[:5]) or f"{sum(j.status == 'succeeded' for j in jobs)} read back",
    )
    unfinished_results = [
        j.job_id for j in jobs if j.status in ("failed", "cancelled") and j.result_ref
    ]
    ev.check(
        "invariant: failed and cancelled jobs publish nothing",
        not unfinished_results,
        f"jobs: {unfinished_results[:10]}",
    )
    undead = [j.job_id for j in jobs if j.status == "failed" and not j.dead_letter]
    ev.check("invariant: every failed job has a dead letter", not undead, f"jobs: {undead[:10]}")


def log_time(record: dict[str, Any]) -> float | None:
    """Unix time of a JSON log record (``ts`` is the process's local time, milliseconds)."""
    ts = record.get("ts")
    if not ts:
        return None
    try:
        whole, _, millis = str(ts).partition(",")
        return time.mktime(time.strptime(whole, "%Y-%m-%d %H:%M:%S")) + int(millis or 0) / 1000
    except ValueError:
        return None


def seconds_between(a: Any, b: Any) -> float | None:
    """``b - a`` in seconds for datetimes or Unix times (None when either is missing)."""
    if a is None or b is None:
        return None
    ta = a.timestamp() if hasattr(a, "timestamp") else float(a)
    tb = b.timestamp() if hasattr(b, "timestamp") else float(b)
    return round(tb - ta, 3)
