"""Measure the two starvation cases (a tenant's backlog ahead of another's exports, a
schedule blocking the tick) on a real stack (a probe, not a test: it
reports numbers and asserts nothing).

``schedules``: a tenant at its quota with N schedules every second (``catch_up: all``) and a
victim with one schedule every 2 s; how many slots of the victim's schedule ran in a window.

``refusals``: what one refused ``POST /v1/exports {"all": true}`` costs the database (wall
time and WAL bytes per request) when the tenant's quota refuses it, and when the submit rate
limit does (where the code has one).

    python -m devtools.starvation schedules --seconds 40
    python -m devtools.starvation refusals --requests 20

It starts its own PostgreSQL and Redis under ``.starvation/`` (``--pg-port``,
``--redis-port``) and the Procfile's processes (without the bulk worker, so that the
attacker's bulk exports stay queued and keep it at its quota), and only talks to them over
HTTP, ``exportctl`` and SQL, so the same probe measures an older checkout too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx

from devtools.api_client import ApiClient
from devtools.probe import DatabaseProbe
from devtools.stack import ROOT, Servers, Stack, migrate

NOTES = Path("/usr/share/doc")


def _exportctl(env: dict[str, str], *args: str) -> str:
    exe = Path(sys.executable).parent / "exportctl"
    return subprocess.run(
        [str(exe), *args], env=env, capture_output=True, text=True, check=True
    ).stdout


def _notes_folder() -> Path:
    """The Markdown and text documentation of this machine (what `make dev` imports)."""
    dst = Path(tempfile.mkdtemp(prefix="starvation-notes-"))
    for f in sorted(NOTES.rglob("*")):
        if f.suffix in (".md", ".txt") and f.is_file() and not f.is_symlink():
            target = dst / f.relative_to(NOTES)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.read_bytes())
    return dst


class Probe:
    """A database, the stack's processes and two tenants with real notes."""

    def __init__(self, args: argparse.Namespace, extra_env: dict[str, str]) -> None:
        self.servers = Servers(ROOT / ".starvation", args.pg_port, args.redis_port)
        self.servers.start()
        name = f"probe_{uuid4().hex[:8]}"
        self.db = self.servers.create_database(name)
        migrate(self.db)
        self.name = name
        base = ROOT / ".starvation" / name
        self.stack = Stack.build(
            database_url=self.db,
            broker_url=self.servers.redis_url(0),
            artifact_dir=base / "artifacts",
            log_dir=base / "logs",
            names=("api", "publisher", "recovery-scanner", "beat", "fast-worker"),
            extra_env=extra_env,
        )
        env = self.stack.env
        folder = _notes_folder()
        self.apis: dict[str, ApiClient] = {}
        for tenant in ("attacker", "victim"):
            _exportctl(env, "tenant", "create", tenant)
            key = _exportctl(env, "apikey", "create", tenant, "--quiet").strip()
            self.apis[tenant] = ApiClient(self.stack.api_url, key, timeout=60)
            _exportctl(env, "notes", "import", str(folder), "--tenant", tenant)
        self.probe = DatabaseProbe(self.db)
        self.stack.start()

    def api(self, tenant: str) -> httpx.Client:
        """An HTTP client of the api that sends ``tenant``'s key."""
        return self.apis[tenant].http()

    def sql(self, query: str, *params: Any) -> Any:
        """The first column of the first row of ``query``."""
        return self.probe.scalar(query, params)

    def close(self) -> None:
        self.probe.close()
        self.stack.stop()
        self.servers.drop_database(self.name)
        self.servers.stop()


def _fill_quota(p: Probe, quota: int) -> None:
    _exportctl(p.stack.env, "tenant", "set-quota", "attacker", str(quota))
    with p.api("attacker") as api:
        for _ in range(quota):
            r = api.post("/v1/exports", json={"all": True})
            assert r.status_code == 202, r.text  # bulk: stays queued (no bulk worker)


def schedules(args: argparse.Namespace) -> dict[str, Any]:
    env = {
        "SCHEDULER_TICK_SECONDS": str(args.tick),
        "SCHEDULE_MIN_INTERVAL_SECONDS": "1",  # the measured case's 1-second schedules
        "SCHEDULES_PER_TENANT_MAX": str(max(100, args.schedules)),
    }
    p = Probe(args, env)
    try:
        _fill_quota(p, args.quota)
        with p.api("attacker") as api:
            for i in range(args.schedules):
                r = api.post(
                    "/v1/schedules",
                    json={
                        "name": f"flood-{i}",
                        "interval_seconds": 1,
                        "all": True,
                        "catch_up": "all",
                        "max_catch_up": 1000,
                        "overlap": "allow_all",  # every slot, as the measured case had it
                    },
                )
                assert r.status_code == 201, r.text
        with p.api("victim") as api:
            ids = [
                int(x)
                for x in p.sql(
                    "SELECT array_agg(id ORDER BY id) FROM"
                    " (SELECT id FROM notes WHERE tenant_id = 'victim' ORDER BY id LIMIT 3) n"
                )
            ]
            r = api.post("/v1/schedules", json={"interval_seconds": 2, "note_ids": ids})
            assert r.status_code == 201, r.text
            victim = r.json()["id"]
        start = time.monotonic()
        time.sleep(args.seconds)  # the measured window (a probe, not a test)
        elapsed = time.monotonic() - start
        ran = p.sql(
            "SELECT count(*) FROM export_schedule_slots WHERE schedule_id = %s"
            " AND outcome = 'created'",
            victim,
        )
        succeeded = p.sql(
            "SELECT count(*) FROM export_schedule_slots s JOIN export_jobs j ON j.id = s.job_id"
            " WHERE s.schedule_id = %s AND j.status = 'succeeded'",
            victim,
        )
        log = p.stack.procs["fast-worker"].log_text()
        return {
            "window_seconds": round(elapsed, 1),
            "tick_seconds": args.tick,
            "attacker_schedules": args.schedules,
            "attacker_quota": args.quota,
            "victim_interval_seconds": 2,
            "victim_slots_due": int(elapsed // 2),
            "victim_slots_created": ran,
            "victim_exports_succeeded": succeeded,
            "attacker_jobs": p.sql("SELECT count(*) FROM export_jobs WHERE tenant_id = 'attacker'"),
            "refused_log_lines": log.count("scheduled slot refused"),
        }
    finally:
        p.close()


def refusals(args: argparse.Namespace) -> dict[str, Any]:
    p = Probe(args, {"TENANT_SUBMIT_RATE": "0.001", "TENANT_SUBMIT_BURST": str(args.quota + 1)})
    try:
        _fill_quota(p, args.quota)
        notes = p.sql("SELECT count(*) FROM notes WHERE tenant_id = 'attacker'")
        out: dict[str, Any] = {"notes": notes}
        with p.api("attacker") as api:
            for _ in range(args.requests + 1):  # the first one past the quota spends the burst
                lsn = p.sql("SELECT pg_current_wal_insert_lsn()::text")
                t0 = time.perf_counter()
                r = api.post("/v1/exports", json={"all": True})
                took = time.perf_counter() - t0
                wal = p.sql("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", lsn)
                code = r.json().get("type", "").rsplit("/", 1)[-1]
                entry = out.setdefault(f"{r.status_code} {code}", {"n": 0, "ms": [], "wal": []})
                entry["n"] += 1
                entry["ms"].append(took * 1000)
                entry["wal"].append(float(wal))
            reads = []  # for scale: an authenticated read of one row, same client and stack
            for _ in range(args.requests):
                t0 = time.perf_counter()
                api.get("/v1/exports", params={"limit": 1})
                reads.append((time.perf_counter() - t0) * 1000)
            out["reference: GET /v1/exports?limit=1 median_ms"] = round(
                sorted(reads)[len(reads) // 2], 2
            )
        for key, entry in out.items():
            if isinstance(entry, dict):
                ms, wal = sorted(entry.pop("ms")), entry.pop("wal")
                entry["median_ms"] = round(ms[len(ms) // 2], 2)
                entry["mean_wal_bytes"] = round(sum(wal) / len(wal))
                out[key] = entry
        return out
    finally:
        p.close()


def main(argv: list[str] | None = None) -> int:
    """Run one probe and print its numbers as JSON."""
    parser = argparse.ArgumentParser(prog="python -m devtools.starvation", description=__doc__)
    parser.add_argument("probe", choices=("schedules", "refusals"))
    parser.add_argument("--pg-port", type=int, default=55471)
    parser.add_argument("--redis-port", type=int, default=56411)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--quota", type=int, default=3)
    parser.add_argument("--tick", type=float, default=1.0)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args(argv)
    result = schedules(args) if args.probe == "schedules" else refusals(args)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
