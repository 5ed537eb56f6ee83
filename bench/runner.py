"""Runs the scenarios, alternating systems run by run, and writes the report."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import report
from bench.common import BENCH_DIR, Config
from bench.e2e import ALL_SYSTEMS, OURS_ENV, run_system
from bench.env import BenchEnv, machine, versions
from exportcore.settings import Settings


def log(msg: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def _settings_used(cfg: Config) -> dict[str, Any]:
    defaults = Settings().model_dump(mode="json")
    for k in ("database_url", "celery_broker_url"):
        defaults.pop(k, None)
    return {
        "harness": asdict(cfg),
        "product_defaults": defaults,
        "product_overrides": {
            **OURS_ENV,
            "LOG_LEVEL (ours-lib-warning)": "WARNING",
            "FAST_WORKER_CONCURRENCY": str(cfg.worker_processes),
            "API_WORKERS": os.environ.get("API_WORKERS", "gunicorn_conf default"),
            "LOG_LEVEL": os.environ.get("LOG_LEVEL", "INFO"),
        },
        "e2e_processes": {
            "ours-lib": "publisher, recovery-scanner, fast-worker (prefork children = workers)",
            "ours-http": "api (gunicorn), publisher, recovery-scanner, fast-worker",
            "celery": "one celery worker, prefork children = workers, --loglevel WARNING",
            "procrastinate": "one worker process per worker (concurrency 1)",
            "pgqueuer-*": "one worker process per worker (PgQueuer.run defaults), its jobs run"
            " on a 1-thread pool: one execution at a time per process",
            "concurrency": f"{cfg.worker_processes} concurrent job executions for every system",
        },
    }


def _scenario(name: str) -> Callable[[BenchEnv, Config, Path, Callable[[str], None]], Any]:
    """``bench.<name>.run_<name>``, the scenario's entry point (env, config, run folder, log
    -> its results), imported only when the scenario runs (the peers' and S3 clients' imports
    stay out of the others)."""
    run_scenario: Callable[[BenchEnv, Config, Path, Callable[[str], None]], Any] = getattr(
        importlib.import_module(f"bench.{name}"), f"run_{name}"
    )
    return run_scenario


def _rotate(systems: list[str], i: int) -> list[str]:
    k = i % len(systems)
    return systems[k:] + systems[:k]


def run(cfg: Config, only: tuple[str, ...], keep_servers: bool = False) -> int:
    started = datetime.now(UTC)
    env = BenchEnv()
    log(
        f"servers under {env.base} "
        f"(PostgreSQL :{env.servers.pg_port}, Redis :{env.servers.redis_port})"
    )
    env.start()
    results: dict[str, Any] = {
        "meta": {
            "started": started.isoformat(),
            "quick": cfg.quick,
            "runs": cfg.runs,
            "machine_before": machine(),
            "versions": versions(),
            "postgres": env.postgres_settings(),
            "redis": env.redis_info(),
            "settings": _settings_used(cfg),
        },
        "scenarios": {},
    }
    try:
        log("template database: schema, tenant, API key, real notes, peers' schemas")
        seed = env.prepare_template()
        results["meta"]["seed"] = asdict(seed) | {"api_key": "(not recorded)"}
        run_root = BENCH_DIR / "runs" / started.strftime("%Y%m%dT%H%M%S")
        if "e2e" in only:
            results["scenarios"]["e2e"] = run_e2e(env, cfg, run_root)
        for name in ("costs", "api", "bulk"):
            if name in only:
                results["scenarios"][name] = _scenario(name)(env, cfg, run_root, log)
        if "scale" in only or "console" in only:
            from bench.scale import run_scale

            scale = run_scale(
                env, cfg, run_root, log, scale="scale" in only, console="console" in only
            )
            if "console" in scale:
                results["scenarios"]["console"] = scale.pop("console")
            if "scale" in only:
                results["scenarios"]["scale"] = scale
        for name in ("bulk_replay", "recovery", "webhooks", "fairness"):
            if name in only:
                results["scenarios"][name] = _scenario(name)(env, cfg, run_root, log)
    finally:
        if not keep_servers:
            env.stop()
    results["meta"]["finished"] = datetime.now(UTC).isoformat()
    results["meta"]["machine_after"] = machine()
    results["figures"] = report.figures(results)
    results["ratios"] = {**report.ratios(results["figures"]), **report.footing_ratios(results)}
    results["targets"] = report.targets(results["figures"]) + report.footing_targets(results)
    results["e2e_table"] = report.e2e_table(results)
    results["pg_per_export"] = report.pg_per_export(results)
    out_dir = BENCH_DIR / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = (
        out_dir / f"bench-{started.strftime('%Y%m%dT%H%M%SZ')}{'-quick' if cfg.quick else ''}.json"
    )
    path.write_text(json.dumps(results, indent=2, default=str))
    shutil.copyfile(path, out_dir / "latest.json")
    report.print_table(results)
    print(f"\nJSON: {path}")
    return 0


def run_e2e(env: BenchEnv, cfg: Config, run_root: Path) -> dict[str, Any]:
    systems = list(cfg.systems or ALL_SYSTEMS)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for i in range(cfg.runs):
        order = _rotate(systems, i)
        log(f"e2e run {i + 1}/{cfg.runs}: {', '.join(order)}")
        for name in order:
            t = time.monotonic()
            runs[name].append(run_system(name, env, cfg, run_root / f"e2e-{i}" / name, log))
            runs[name][-1]["run"] = i
            runs[name][-1]["seconds"] = round(time.monotonic() - t, 1)
    return {"systems": runs, "order": "rotated by one system per run"}


def profile(cfg: Config, keep_servers: bool = False) -> int:
    from bench.profile import run_profile

    env = BenchEnv()
    env.start()
    try:
        env.prepare_template()
        run_profile(env, cfg, log)
    finally:
        if not keep_servers:
            env.stop()
    return 0
