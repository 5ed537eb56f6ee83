"""Failpoints: named places where drills and tests inject ONE real fault into real processes.

Disabled (one environment lookup, nothing else) unless ``EXPORTS_FAULTS_FILE`` names a JSON
file such as::

    {"render.chunk": {"remaining": 2, "fault": "io"}}

Every process of a stack reads the same file; each hit of an armed failpoint decrements
``remaining`` under an exclusive ``flock`` (so "fail twice" means twice across all worker
processes), records which process took it and when (``hits``: the evidence a drill needs to
signal exactly that PID), and then injects the fault:

- ``io``: ``OSError(EIO)`` — a transient storage error
- ``db``: ``psycopg.OperationalError`` — the database connection broke
- ``permanent``: ``PermanentError("injected_permanent")`` — a job that can never succeed
- ``exit``: ``os._exit(137)`` — the process dies on the spot, as with SIGKILL
- ``sleep:<seconds>``: the process stalls (no exception)

Never set the variable in production.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psycopg

from exportcore.failures import PermanentError

ENV = "EXPORTS_FAULTS_FILE"
POINTS = (
    "submit.before_commit",
    "worker.before_claim",
    "render.chunk",
    "artifact.commit",
    "worker.before_finish",
    "publisher.after_send",
    "bulk.batch",
)


def enabled() -> bool:
    """True when failpoints are enabled in this process (``EXPORTS_FAULTS_FILE`` is set)."""
    return bool(os.environ.get(ENV))


def hit(name: str, subjects: Iterable[object] = ()) -> None:
    """Inject the fault armed for ``name``, if any (no-op when failpoints are disabled).
    ``subjects``: what this hit is about (e.g. the job ids of a delivery), for a failpoint
    armed ``only`` for one of them."""
    path = os.environ.get(ENV)
    if not path:
        return
    fault = _take(Path(path), name, {str(s) for s in subjects})
    if fault is not None:
        _inject(name, fault)


def arm(
    path: Path,
    name: str,
    fault: str,
    times: int = 1,
    only: object | None = None,
    skip: int = 0,
) -> None:
    """Arm ``name`` to inject ``fault`` for the next ``times`` hits (tests and drills);
    with ``only`` (e.g. a job id), only hits whose subjects include it count; with ``skip``,
    the first ``skip`` of those pass untouched (a fault at the N-th chunk of a render)."""
    if name not in POINTS:
        raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(POINTS)}")
    with _locked(path) as (data, save):
        data[name] = {"remaining": times, "fault": fault}
        if only is not None:
            data[name]["only"] = str(only)
        if skip:
            data[name]["skip"] = skip
        save(data)


def remaining(path: Path, name: str) -> int:
    """How many more hits of ``name`` will fail."""
    with _locked(path) as (data, _):
        return int(data.get(name, {}).get("remaining", 0))


def hits(path: Path, name: str) -> list[dict[str, Any]]:
    """The injections of ``name`` since it was last armed, oldest first: ``{"pid": process
    that took it, "at": Unix time, "fault": what was injected}`` (at most ``MAX_HITS``)."""
    with _locked(path) as (data, _):
        return list(data.get(name, {}).get("hits", []))


def disarm_all(path: Path) -> None:
    """Disarm every failpoint of the file (hits are forgotten too)."""
    with _locked(path) as (_, save):
        save({})


MAX_HITS = 50


def _take(path: Path, name: str, subjects: set[str]) -> str | None:
    with _locked(path) as (data, save):
        entry = data.get(name)
        if not entry or entry.get("remaining", 0) <= 0:
            return None
        if "only" in entry and entry["only"] not in subjects:
            return None
        if entry.get("skip", 0) > 0:
            entry["skip"] -= 1
            save(data)
            return None
        entry["remaining"] -= 1
        taken = entry.setdefault("hits", [])
        taken.append({"pid": os.getpid(), "at": time.time(), "fault": entry["fault"]})
        del taken[:-MAX_HITS]
        save(data)
        return str(entry["fault"])


def _inject(name: str, fault: str) -> None:
    if fault == "io":
        raise OSError(errno.EIO, f"injected I/O error at {name}")
    if fault == "db":
        raise psycopg.OperationalError(f"injected connection failure at {name}")
    if fault == "permanent":
        raise PermanentError("injected_permanent", f"injected permanent error at {name}")
    if fault == "exit":
        os._exit(137)
    if fault.startswith("sleep:"):
        time.sleep(float(fault.split(":", 1)[1]))
        return
    raise ValueError(f"unknown fault {fault!r} at failpoint {name}")


class _locked:
    """Context manager: ``(data, save)`` of the faults file under an exclusive flock."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> tuple[dict[str, Any], Any]:
        self.fh = open(self.path, "a+")
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        self.fh.seek(0)
        text = self.fh.read()
        data: dict[str, Any] = json.loads(text) if text.strip() else {}

        def save(new: dict[str, Any]) -> None:
            self.fh.seek(0)
            self.fh.truncate()
            self.fh.write(json.dumps(new))
            self.fh.flush()

        return data, save

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()
