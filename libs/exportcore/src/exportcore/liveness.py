"""Liveness: a file (``HEARTBEAT_FILE``) whose modification time a process advances only when
it makes progress (a heartbeat), and the check a probe runs against it.

Background processes (publisher, recovery-scanner, beat-driven loops via
:class:`~exportcore.service.ServiceLoop`, and the Celery workers through their consumer
bootstep, :mod:`services.worker.liveness_bootstep`) call :func:`touch` after each unit of
real work. The probe,
``python -m exportcore.liveness [--file PATH] --max-age SECONDS`` (the chart's exec
startup, liveness and readiness probe; ``exportctl healthcheck`` is the same check for a
person), exits 0 while the file is fresh and 1 when it is stale or missing, so a process that
is alive but stuck fails its liveness probe.

The probe imports nothing but the standard library: an exec probe runs every few seconds in
every pod, inside the container's CPU limit, and must answer well within its timeout on a
busy node (``exportctl``, which loads the whole CLI, took over 10 s there and failed the
startup probes of every background process on the test cluster).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


def touch(path: Path) -> None:
    """Create ``path`` if needed and set its modification time to now.

    The update is a single ``utime`` system call, so a reader sees either the previous or the
    new time, never a partial state. Raises ``OSError`` when the file cannot be written.
    """
    try:
        os.utime(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(fd)
        os.utime(path)


def touch_configured() -> bool:
    """Touch the ``HEARTBEAT_FILE`` of this process, if one is configured.

    Returns True when a heartbeat was written. A failure to write is logged, never raised: the
    caller's work must not stop because of its liveness signal (the probe will report it).
    """
    from exportcore.settings import get_settings

    path = get_settings().heartbeat_file
    if path is None:
        return False
    try:
        touch(path)
    except OSError as exc:
        log.warning("heartbeat not written", extra={"path": str(path), "error": repr(exc)})
        return False
    return True


@dataclass(frozen=True)
class LivenessStatus:
    """The result of :func:`check`: ``fresh``, the age in seconds (None if missing) and a
    one-line message for probe output."""

    fresh: bool
    age: float | None
    message: str


def check(path: Path, max_age: float, now: float | None = None) -> LivenessStatus:
    """Whether ``path`` was touched within the last ``max_age`` seconds (wall clock)."""
    now = time.time() if now is None else now
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return LivenessStatus(False, None, f"stale: heartbeat file {path} does not exist")
    except OSError as exc:
        return LivenessStatus(False, None, f"stale: cannot read heartbeat file {path}: {exc}")
    age = now - mtime
    if age > max_age:
        return LivenessStatus(
            False, age, f"stale: last heartbeat {age:.1f}s ago (max {max_age:g}s) in {path}"
        )
    return LivenessStatus(True, age, f"fresh: last heartbeat {max(age, 0.0):.1f}s ago")


def main(argv: list[str] | None = None) -> int:
    """``python -m exportcore.liveness``: print the status, return 0 (fresh) or 1 (stale or
    missing); 2 when the file is neither given nor in ``HEARTBEAT_FILE``."""
    parser = argparse.ArgumentParser(
        prog="python -m exportcore.liveness",
        description="Exit 0 when the heartbeat file was touched within --max-age seconds.",
    )
    parser.add_argument("--file", type=Path, default=os.environ.get("HEARTBEAT_FILE") or None,
                        help="the heartbeat file (default: $HEARTBEAT_FILE)")  # fmt: skip
    parser.add_argument(
        "--max-age", type=float, default=60.0, help="seconds after which it is stale"
    )
    args = parser.parse_args(argv)
    if args.file is None:
        print("no heartbeat file: pass --file or set HEARTBEAT_FILE", file=sys.stderr)
        return 2
    if args.max_age <= 0:
        print("--max-age must be positive", file=sys.stderr)
        return 2
    status = check(args.file, args.max_age)
    print(status.message)
    return 0 if status.fresh else 1


if __name__ == "__main__":
    sys.exit(main())
