"""The drill registry and the runner: one drill at a time on one environment, one evidence
file per drill."""

from __future__ import annotations

import contextlib
import importlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.drills.config import DrillSettings
from devtools.drills.evidence import Evidence, JobWatcher, collect, jsonable, now_iso
from devtools.drills.harness import DrillEnvironment, Tenant, wait_for
from devtools.drills.servers import Topology
from devtools.stack import ManagedProcess

GROUPS = ("matrix", "process", "infra", "failover")
MODULES = (
    "devtools.drills.matrix",
    "devtools.drills.processes",
    "devtools.drills.infra",
    "devtools.drills.batches",
    "devtools.drills.fairness",
    "devtools.drills.failover",
    "devtools.drills.resume",
    "devtools.drills.bulk_actions",
)


@dataclass
class DrillContext:
    """What a drill function gets: the environment, its own tenant, the evidence record,
    and a place to register the steps that restore the system afterwards."""

    env: DrillEnvironment
    ev: Evidence
    tenant: Tenant
    watcher: JobWatcher
    cleanups: list[tuple[str, Callable[[], Any]]] = field(default_factory=list)

    @property
    def settings(self) -> DrillSettings:
        """The settings the stack runs with."""
        return self.env.settings

    def defer(self, what: str, fn: Callable[[], Any]) -> None:
        """Run ``fn`` when the drill ends, whatever happened (restore the system)."""
        self.cleanups.append((what, fn))

    def keep_running(self, name: str) -> ManagedProcess:
        """Process ``name``, started again when the drill ends unless it runs then (for a
        drill that stops or kills it)."""
        proc = self.env.proc(name)
        self.defer(f"{name} running", lambda: proc.alive or self.env.start_process(name))
        return proc

    def stop(self, name: str) -> int | None:
        """Stop process ``name`` gracefully (TERM: it finishes what it holds) for the rest
        of the drill (:meth:`keep_running`); returns its exit code."""
        self.keep_running(name)
        return self.env.stop_process(name)

    def inject(self, point: str, fault: str, times: int = 1, **about: Any) -> None:
        """Arm failpoint ``point`` with ``fault`` (``exportcore.faults``: ``db``, ``io``,
        ``exit``, ``sleep:S``…) for ``times`` injections in every process, and record it as
        the drill's fault: ``ev.fault = {failpoint, fault, times, **about}``."""
        self.env.arm(point, fault, times)
        self.ev.fault = {"failpoint": point, "fault": fault, "times": times, **about}

    def injections(self) -> list[dict[str, Any]]:
        """The injections of the drill's fault (:meth:`inject`) so far (pid, time, fault),
        recorded as ``ev.fault["hits"]``."""
        hits = self.env.hits(self.ev.fault["failpoint"])
        self.ev.fault["hits"] = hits
        return hits

    def wait_injections(self, n: int = 1, timeout: float = 30.0) -> list[dict[str, Any]]:
        """:meth:`injections` once there are ``n`` (``DrillTimeout`` after ``timeout`` s)."""
        self.env.wait_hits(self.ev.fault["failpoint"], n, timeout)
        return self.injections()

    def submit(self, body: dict[str, Any], key: str | None = None, role: str = "job") -> str:
        """Submit as the drill's tenant (expects 202) and track the job."""
        job_id = self.tenant.api.submit_ok(body, key)
        self.ev.track(job_id, role)
        return job_id

    def small(self, n: int = 3, fmt: str = "json") -> dict[str, Any]:
        """A request body for ``n`` notes (the fast queue)."""
        return {"note_ids": self.tenant.note_ids[:n], "format": fmt}

    def bulk(self, fmt: str = "ndjson") -> dict[str, Any]:
        """A request body for every note (the bulk queue)."""
        return {"all": True, "format": fmt}


DrillFn = Callable[[DrillContext], None]


@dataclass(frozen=True)
class Drill:
    """A registered drill."""

    name: str
    fn: DrillFn
    title: str
    group: str
    matrix_row: str | None = None
    ci: bool = False
    needs_artifact_mount: bool = False
    s3: bool = False  # also run on an S3 artifact store (CI: tests/drills)
    topology: Topology = "single"  # "ha": Patroni + Sentinel (devtools/drills/servers.py)


REGISTRY: dict[str, Drill] = {}


def drill(
    name: str,
    *,
    title: str,
    group: str,
    matrix_row: str | None = None,
    ci: bool = False,
    needs_artifact_mount: bool = False,
    s3: bool = False,
    topology: Topology = "single",
) -> Callable[[DrillFn], DrillFn]:
    """Register a drill function under ``name``; ``s3``: the drill's checks go through the
    store API only, so it also runs with the artifacts on an S3-compatible server;
    ``topology``: the servers it needs (``ha``: the failover drills)."""
    if group not in GROUPS:
        raise ValueError(f"unknown group {group!r}")

    def register(fn: DrillFn) -> DrillFn:
        if name in REGISTRY:
            raise ValueError(f"drill {name!r} registered twice")
        REGISTRY[name] = Drill(
            name, fn, title, group, matrix_row, ci, needs_artifact_mount, s3, topology
        )
        return fn

    return register


def load() -> dict[str, Drill]:
    """Import every drill module (registration happens at import); returns the registry."""
    for module in MODULES:
        importlib.import_module(module)
    return REGISTRY


def select(only: Sequence[str] | None = None, ci: bool = False, s3: bool = False) -> list[Drill]:
    """Drills by name (in the order given), or all (registry order), or the CI subset; with
    ``s3`` only those that also run on an S3 artifact store (named ones included)."""
    registry = load()
    if only:
        unknown = [n for n in only if n not in registry]
        if unknown:
            raise KeyError(f"unknown drill(s): {', '.join(unknown)}; see --list")
        return [registry[n] for n in only if registry[n].s3 or not s3]
    return [d for d in registry.values() if (d.ci or not ci) and (d.s3 or not s3)]


def prepare(env: DrillEnvironment, ev: Evidence) -> None:
    """Before a drill: no armed failpoint, both servers up, every process running and
    resumed, storage writable, and no job of an earlier drill still active."""
    env.disarm()
    env.restore_storage()
    started = env.ensure_servers()
    restarted = env.ensure_running()
    if started or restarted:
        ev.note("restored before the drill", servers=started, processes=restarted)
    try:
        wait_for(lambda: env.active_jobs() == 0, 60, "no active job left by an earlier drill")
    except AssertionError:
        left = env.db.sql(
            "SELECT id, tenant_id, status FROM export_jobs WHERE status IN ('queued', 'running')"
        )
        ev.note("active jobs left by an earlier drill", jobs=left)
    env.logs.refresh()


def run_drill(env: DrillEnvironment, d: Drill) -> Evidence:
    """Run one drill: prepare, inject its one fault, restore, collect the evidence."""
    ev = Evidence(d.name, d.title, d.group, d.matrix_row)
    ev.settings = env.settings.as_dict()
    ev.budgets = env.settings.budgets()
    ev.observe("artifact_backend", env.backend)
    error: BaseException | None = None
    watcher: JobWatcher | None = None
    try:
        if d.topology != env.topology:
            ev.skip(f"needs the {d.topology} topology; this environment is {env.topology}")
            ev.finish()
            return ev
        if env.backend == "s3" and not d.s3:
            ev.skip("reads the artifact folder itself; not run on the S3 store")
            ev.finish()
            return ev
        if d.needs_artifact_mount and not env.artifact_mount:
            ev.skip("needs the artifact folder on its own tmpfs (root, mount -t tmpfs)")
            ev.finish()
            return ev
        prepare(env, ev)
        tenant = env.new_tenant(d.name)
        ev.observe("tenant", tenant.id)
        watcher = JobWatcher(env, tenant.id).start()
        ctx = DrillContext(env, ev, tenant, watcher)
        try:
            d.fn(ctx)
        except BaseException as exc:  # the drill's own failure is the verdict's reason
            error = exc
        finally:
            for what, fn in reversed(ctx.cleanups):
                try:
                    fn()
                    ev.note(f"restored: {what}")
                except Exception as exc:
                    ev.note(f"restore failed: {what}", error=f"{type(exc).__name__}: {exc}")
                    if error is None:
                        error = exc
            watcher.stop()
        if not ev.skipped:
            collect(env, ev, watcher)
            if watcher.gaps:
                ev.observe("watcher_database_gaps", watcher.gaps)
    except Exception as exc:
        error = error or exc
    if isinstance(error, KeyboardInterrupt):
        raise error
    ev.finish(error)
    return ev


def run_drills(
    drills: Iterable[Drill],
    out_dir: Path,
    settings: DrillSettings,
    *,
    say: Callable[[str], None] = print,
    env: DrillEnvironment | None = None,
    pooler: bool = False,
) -> list[Evidence]:
    """Run drills one after the other, on ``env`` or on one environment per topology they
    need (started here; ``pooler``: the processes go through PgBouncer); writes
    ``<out_dir>/<drill>.json`` for each and ``<out_dir>/summary.json``."""
    drills = list(drills)
    results: list[Evidence] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    own = env is None
    topologies = (
        [env.topology] if env is not None else list(dict.fromkeys(d.topology for d in drills))
    )
    environments: list[dict[str, Any]] = []
    done = 0
    for topology in topologies:
        group = [d for d in drills if d.topology == topology or env is not None]
        context = (
            DrillEnvironment(settings, say=say, topology=topology, pooler=pooler)
            if env is None
            else contextlib.nullcontext(env)
        )
        with context as active:
            assert active is not None
            environments.append(
                {
                    "path": str(active.base),
                    "topology": active.topology,
                    "pooler": active.pooler,
                    "warm_up": active.warmup,
                }
            )
            for d in group:
                done += 1
                say(f"[{done}/{len(drills)}] {d.name}: {d.title}")
                ev = run_drill(active, d)
                path = ev.write(out_dir)
                results.append(ev)
                say(f"    {ev.verdict.upper()} in {ev.seconds:.1f} s: {ev.reason} ({path.name})")
    summary = {
        "started_at": now_iso(started),
        "seconds": round(time.time() - started, 1),
        "environments": environments,
        "own_environment": own,
        "settings": settings.as_dict(),
        "budgets": settings.budgets(),
        "drills": [
            {
                "drill": ev.name,
                "group": ev.group,
                "matrix_row": ev.matrix_row,
                "verdict": ev.verdict,
                "seconds": round(ev.seconds, 1),
                "jobs": len(ev.tracked),
                "recovery_seconds": ev.recovery_seconds,
                "reason": ev.reason,
                "file": f"{ev.name}.json",
            }
            for ev in results
        ],
    }
    (out_dir / "summary.json").write_text(json.dumps(jsonable(summary), indent=2) + "\n")

    return results
