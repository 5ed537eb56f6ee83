"""Evidence records: what a drill observed, the checks made on it, and its verdict.

A drill is marked passed only when it made at least one check and every check held; each
check is computed from something observed on the running system (database rows, history
events, worker logs, HTTP answers, artifacts read back through the store), never from what
the drill expected to happen. An exception inside a drill fails it with the exception as
the reason.
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


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
