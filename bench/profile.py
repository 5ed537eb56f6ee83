"""Profiles of the end-to-end path under steady load: ``make profile``.

Starts api, publisher, recovery-scanner and fast-worker (2 prefork children) on a fresh
database, sends POST /v1/exports at ``profile_rate`` req/s (open loop) and, meanwhile,
records each process with py-spy (``--subprocesses`` for gunicorn's workers and Celery's
children; ``--gil``: only threads holding the GIL, so the samples are where Python spends
CPU, not where it waits for PostgreSQL, Redis, fsync or epoll, which release the GIL) into
``.bench/profiles/<time>/<process>.speedscope.json`` (open in https://www.speedscope.app or
``speedscope FILE``). ``summary.md`` beside them lists, per process, the CPU seconds it used
in the window (psutil) and the functions with the most samples (inclusive and self).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from bench import loadgen
from bench.common import BENCH_DIR, Config, CpuMeter, postgres_pids, redis_pids
from bench.e2e import build_stack
from bench.env import BenchEnv
from devtools.api_client import bearer
from devtools.waiting import became_true

PROCESSES = ("api", "publisher", "recovery-scanner", "fast-worker")
# Leaf frames where a thread waits (locks, selectors, queues, libpq round trips): samples
# ending there are reported apart, the rest approximates where CPU goes.
WAITS = {
    "Condition.wait",
    "Event.wait",
    "Queue.get",
    "_PollLikeSelector.select",
    "EpollSelector.select",
    "Connection.wait",
    "AsyncConnection.wait",
    "sleep",
    "select",
    "poll",
    "_wait_for_tstate_lock",
    "Thread.join",
    "lock.acquire",
    "Lock.acquire",
}


def py_spy() -> str:
    exe = Path(sys.executable).parent / "py-spy"
    return str(exe) if exe.exists() else (shutil.which("py-spy") or "py-spy")


def _package(frame: dict[str, Any]) -> str | None:
    file = str(frame.get("file", ""))
    if "site-packages/" in file:
        return file.split("site-packages/", 1)[1].split("/", 1)[0]
    if "libs/exportcore" in file:
        return "exportcore"
    if "/services/" in file:
        return "services"
    return None


def summarize(path: Path, top: int = 15) -> dict[str, Any]:
    """Inclusive and self sample counts per function of a py-spy speedscope file."""
    data = json.loads(path.read_text())
    frames = data["shared"]["frames"]
    inclusive: Counter[int] = Counter()
    self_: Counter[int] = Counter()
    waits: Counter[int] = Counter()
    packages: Counter[str] = Counter()
    total = waiting = 0.0
    for prof in data["profiles"]:
        for stack, weight in zip(prof["samples"], prof["weights"], strict=False):
            if not stack:
                continue
            if frames[stack[-1]]["name"] in WAITS:
                waiting += weight
                waits[stack[-2] if len(stack) > 1 else stack[-1]] += weight
                continue
            total += weight
            self_[stack[-1]] += weight
            # the deepest frame of a third-party or project package owns the sample
            owner = next((p for p in (_package(frames[i]) for i in reversed(stack)) if p), "stdlib")
            packages[owner] += weight
            for f in set(stack):
                inclusive[f] += weight
    total = total or 1.0

    def name(i: int) -> str:
        f = frames[i]
        file = str(f.get("file", "")).split("site-packages/")[-1].split("/wt-bench/")[-1]
        return f"{f['name']} ({file}:{f.get('line', '')})"

    ours = Counter(
        {
            i: n
            for i, n in inclusive.items()
            if "libs/exportcore" in str(frames[i].get("file", ""))
            or "/services/" in str(frames[i].get("file", ""))
        }
    )
    return {
        "packages": [(p, n, round(100 * n / total, 1)) for p, n in packages.most_common(10)],
        "ours": [(name(i), n, round(100 * n / total, 1)) for i, n in ours.most_common(top)],
        "busy_seconds": round(total, 2),
        "waiting_seconds": round(waiting, 2),
        "inclusive": [
            (name(i), n, round(100 * n / total, 1)) for i, n in inclusive.most_common(top * 3)
        ],
        "self": [(name(i), n, round(100 * n / total, 1)) for i, n in self_.most_common(top)],
        "waits": [
            (name(i), n, round(100 * n / (waiting or 1), 1)) for i, n in waits.most_common(8)
        ],
    }


def _active(db: str) -> int:
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM export_jobs WHERE status IN ('queued', 'running')"
        ).fetchone()
    return int(row[0]) if row else 0


def run_profile(env: BenchEnv, cfg: Config, log: Callable[[str], None]) -> Path:
    assert env.seed is not None
    out_dir = BENCH_DIR / "profiles" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir.mkdir(parents=True, exist_ok=True)
    db = env.fresh_database("profile")
    stack = build_stack(
        env,
        db,
        env.broker_url(6),
        out_dir / "run",
        PROCESSES,
        {"FAST_WORKER_CONCURRENCY": str(cfg.worker_processes)},
    )
    seconds = cfg.profile_seconds
    try:
        stack.start()
        url = stack.api_url + "/v1/exports"
        body = {"note_ids": env.seed.five_note_ids, "format": "json"}
        headers = bearer(env.seed.api_key)
        loadgen.closed_loop(url, body, headers, 4, 100)  # warm-up
        groups = {name: [p.pid] for name, p in stack.procs.items()}
        groups["postgres"] = postgres_pids(env.pg_dir)
        groups["redis"] = redis_pids(env.redis_dir)
        # idle: no load at all (after the warm-up's jobs finished), what the processes cost
        # by themselves
        became_true(lambda: _active(db) == 0, 60)
        time.sleep(1.0)
        meter = CpuMeter(groups, include_self=False)
        meter.start()
        time.sleep(min(seconds, 5.0))
        idle = meter.stop()
        logs: dict[str, str] = {}
        windows: list[tuple[dict[str, float], int]] = []
        # one process at a time, each under its own window of the same steady load, so that
        # one sampler never competes with another for the 2 cores
        for name, proc in stack.procs.items():
            result: dict[str, Any] = {}

            def load(result: dict[str, Any] = result) -> None:
                result["load"] = loadgen.open_loop(url, body, headers, cfg.profile_rate, seconds)

            cmd = [
                py_spy(),
                "record",
                "--pid",
                str(proc.pid),
                "--duration",
                str(int(seconds)),
                "--rate",
                "100",
                "--nonblocking",
                "--gil",
                "--format",
                "speedscope",
                "--output",
                str(out_dir / f"{name}.speedscope.json"),
            ]
            if name in ("api", "fast-worker"):
                cmd.append("--subprocesses")
            feeder = threading.Thread(target=load)
            meter = CpuMeter(groups)
            meter.start()
            feeder.start()
            spy = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            feeder.join()
            windows.append((meter.stop(), result["load"].ok))
            logs[name] = spy.communicate(timeout=seconds + 120)[0].decode(errors="replace")
            (out_dir / f"{name}.py-spy.log").write_text(logs[name])
            log(f"  profile: {name} recorded ({result['load'].ok} requests in its window)")
        jobs = sum(w[1] for w in windows)
        cpu = {k: round(sum(w[0].get(k, 0.0) for w in windows), 3) for k in windows[0][0]}
        lines = [
            f"# Profiles {out_dir.name}",
            "",
            f"Steady load: POST /v1/exports at {cfg.profile_rate:.0f} req/s (open loop); each "
            f"process recorded alone in its own {seconds:.0f} s window (py-spy --rate 100 "
            "--nonblocking --gil: samples only threads holding the GIL, i.e. Python CPU; C code "
            "that releases the GIL — libpq waits, fsync, zlib, epoll — is not in them). CPU below: "
            "all windows together, from psutil (all CPU, native code included).",
            "",
            "## CPU seconds in the window (psutil), and ms per accepted request",
            "",
            "| process | CPU s | ms / job |",
            "| --- | ---: | ---: |",
        ]
        for name, v in cpu.items():
            per = f"{1000 * v / jobs:.2f}" if jobs and name != "wall" else ""
            lines.append(f"| {name} | {v:.2f} | {per} |")
        lines += [
            "",
            f"## CPU seconds with no load at all ({idle['wall']:.1f} s, nothing submitted)",
            "",
            "| process | CPU s | share of one core |",
            "| --- | ---: | ---: |",
        ]
        for name, v in idle.items():
            if name != "wall":
                lines.append(f"| {name} | {v:.2f} | {100 * v / idle['wall']:.0f}% |")
        for name in stack.procs:
            path = out_dir / f"{name}.speedscope.json"
            lines += ["", f"## {name}", ""]
            if not path.exists():
                lines.append("py-spy wrote nothing: " + logs[name][-500:])
                continue
            s = summarize(path)
            lines += [
                f"{s['busy_seconds']} s of samples not waiting ({s['waiting_seconds']} s waiting). "
                "By package (the deepest frame of a third-party or project package owns the "
                "sample): " + ", ".join(f"{p} {pct}%" for p, _, pct in s["packages"]),
                "",
                "Most inclusive (share of the non-waiting samples):",
                "",
                *(f"- {pct}% {fn}" for fn, _, pct in s["inclusive"]),
                "",
                "Most self:",
                "",
                *(f"- {pct}% {fn}" for fn, _, pct in s["self"]),
                "",
                "notes-exports code, inclusive:",
                "",
                *(f"- {pct}% {fn}" for fn, _, pct in s["ours"]),
                "",
                "Waiting, by caller of the wait (share of the waiting samples):",
                "",
                *(f"- {pct}% {fn}" for fn, _, pct in s["waits"]),
            ]
        (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
        (out_dir / "cpu.json").write_text(
            json.dumps({"cpu_seconds": cpu, "jobs": jobs, "idle_cpu_seconds": idle}, indent=2)
        )
        log(f"  profile: {out_dir}/summary.md")
    finally:
        stack.stop()
        env.drop(db)
    return out_dir
