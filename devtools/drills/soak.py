"""The chaos soak: a steady load of submits while a chaos loop kills (SIGKILL) or stalls
(SIGSTOP … SIGCONT) a random component every few seconds and brings it back; then the
chaos stops and every accepted export must settle within the recovery budgets.

What it asserts, all from the database, the broker-independent history and the artifacts
read back through the store:

- every accepted export (202) exists and reaches succeeded, failed or cancelled within its
  recovery budget after the chaos stopped: accepted = succeeded + failed + cancelled;
- exactly one published artifact per succeeded export (one ``succeeded`` event, the
  ``result_ref`` it recorded), readable, with the recorded sha256, and equal to a fresh
  rendering of the export's snapshot;
- attempts never exceed the maximum; no export has two ``succeeded`` events; every failed
  export has a dead letter; cancelled and failed exports publish nothing;
- every lease recovery and every lost-dispatch recovery met its budget, extended by the
  time faults overlapped it (the worst times, and every window over the plain budget, are
  reported);
- the soak tested recovery at all: it recorded at least one lease recovery and one
  lost-dispatch recovery (when its chaos targets include the bulk worker and Redis).

Small exports finish in milliseconds, so random kills seldom land inside one. The soak
therefore makes its bulk exports run for seconds (every render chunk of the bulk worker
stalls ``slow_chunk_seconds``: a failpoints file of its own; ``bulk_children`` children
keep up with them), lets the soak tenant have one more bulk export in flight than there are
children (it waits in Redis), deals the chaos from a shuffled deck
of every (component, fault) pair, the kills that must end in a recovery in the first third
of each round, and aims those kills: a bulk-worker fault waits (up to ``aim_seconds``) for a
bulk export to be running, a Redis kill for a bulk message to be waiting.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
import zipfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from devtools.drills.background import BackgroundLoop
from devtools.drills.checks import finish_budget
from devtools.drills.config import DrillSettings
from devtools.drills.evidence import Check, jsonable, now_iso
from devtools.drills.harness import (
    DrillEnvironment,
    Tenant,
    pid_alive,
    wait_for,
)
from devtools.drills.load import (
    Attempt,
    LoadGenerator,
    outcome_counts,
)
from devtools.drills.report import mapping_table, print_table
from devtools.drills.servers import Topology
from devtools.drills.soak_failovers import NOT_ON_HA, FailoverLoop, failover_report
from devtools.render_check import snapshot_chunks
from exportcore import faults
from exportcore.domain import ExportFormat
from exportcore.render import ExportHeader, NoteRecord, make_renderer

APP_PROCESSES = ("api", "publisher", "recovery-scanner", "beat", "fast-worker", "bulk-worker")
COMPONENTS = (
    *APP_PROCESSES,
    "fast-worker-child",
    "bulk-worker-child",
    "redis",
    "postgres",
)
# A fault delays the recoveries that overlap it (a stopped scanner scans nothing; on a
# two-core machine any restart or burst of backed-up requests takes the CPU the scanner and
# the workers need): a recovery window's budget is extended by the time faults overlapped
# it, counting from QUIET_BEFORE_SECONDS before the window (a fault's aftermath).
QUIET_BEFORE_SECONDS = 2.0
# The faults that must end in a recovery, dealt in the first third of every round: a killed
# bulk worker (or its child) holds a running export's lease, a killed Redis loses the bulk
# message waiting behind it.
RECOVERY_FAULTS = (("bulk-worker", "kill"), ("bulk-worker-child", "kill"), ("redis", "kill"))


@dataclass
class SoakOptions:
    """How long, how fast, how often."""

    duration: float = 120.0
    rate: float = 3.0
    chaos_min: float = 2.0
    chaos_max: float = 5.0
    seed: int | None = None
    components: Sequence[str] | None = None
    bulk_share: float = 0.15
    max_notes: int = 30
    cancel_share: float = 0.2  # of the bulk exports (they wait behind one child: cancellable)
    slow_chunk_seconds: float = 0.5  # per render chunk of a bulk export: 80 notes run ~2 s
    bulk_children: int = 2  # the bulk worker's prefork children during the soak
    bulk_in_flight: int = 3  # the soak tenant's bulk cap: one per child runs, one waits
    aim_seconds: float = 20.0  # how long a recovery fault waits for work in flight to hit
    failovers: bool = False  # on Patroni + Sentinel, a failover every failover_every s
    failover_every: float = 60.0
    settings: DrillSettings = field(default_factory=DrillSettings)


@dataclass
class ChaosEvent:
    """One fault of the chaos loop."""

    target: str
    action: str
    started: float
    ended: float = 0.0
    pids: list[int] = field(default_factory=list)
    detail: str = ""
    error: str | None = None


@dataclass
class SoakResult:
    """The soak's verdict and numbers (``summary`` is what soak.json holds)."""

    passed: bool
    checks: list[Check]
    summary: dict[str, Any]


class Chaos(BackgroundLoop):
    """Kills or stalls one random component at a time, every few seconds, and brings it
    back; only processes and servers of ``env``, addressed by PID. :meth:`stop` finishes
    the fault in hand (its component comes back)."""

    name = "chaos"

    def __init__(
        self,
        env: DrillEnvironment,
        options: SoakOptions,
        rng: random.Random,
        load: LoadGenerator | None = None,
    ) -> None:
        self.env = env
        self.options = options
        self.rng = rng
        self.load = load  # where an aimed fault asks for the bulk exports it needs
        self.components = list(options.components or COMPONENTS)
        if env.topology == "ha":  # the failover loop stands for them (soak_failovers.py)
            self.components = [c for c in self.components if c not in NOT_ON_HA]
        unknown = set(self.components) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"unknown chaos component(s): {sorted(unknown)}")
        self.events: list[ChaosEvent] = []
        self._deck: list[tuple[str, str]] = []
        super().__init__()

    def _run(self) -> None:
        while not self._stop.wait(self.rng.uniform(self.options.chaos_min, self.options.chaos_max)):
            target, action = self._draw()
            aimed = self._aim(target, action)
            event = ChaosEvent(target, action, time.time())
            try:
                self._inject(event)
            except Exception as exc:  # recorded; the settle phase restores what is left
                event.error = f"{type(exc).__name__}: {exc}"
            event.ended = time.time()
            if aimed:
                event.detail = f"{aimed}; {event.detail}" if event.detail else aimed
            self.events.append(event)

    def _draw(self) -> tuple[str, str]:
        """The next (component, fault) from a shuffled deck of every pair: each round of
        the deck takes every pair once (random order, the seed's), the kills of
        ``RECOVERY_FAULTS`` in its first third, so every soak that lasts a round or a third of
        one meets them, however its dice fall."""
        if not self._deck:
            pairs = [(t, a) for t in self.components for a in self._actions(t)]
            self.rng.shuffle(pairs)
            must = [p for p in pairs if p in RECOVERY_FAULTS]
            deck = [p for p in pairs if p not in RECOVERY_FAULTS]
            head = max(len(must), len(pairs) // 3)
            for pair in must:
                deck.insert(self.rng.randrange(0, min(head, len(deck)) + 1), pair)
            self._deck = deck
        return self._deck.pop(0)

    def _aim(self, target: str, action: str) -> str:
        """Wait, at most ``aim_seconds``, until ``target`` holds work the fault can break:
        a running bulk export for a bulk-worker fault, a bulk message waiting in Redis for a
        Redis kill. Returns what the fault was aimed at ("" when it has no aim)."""
        if target in ("bulk-worker", "bulk-worker-child"):
            what, ready = "aimed at a running bulk export", self._bulk_running
        elif (target, action) == ("redis", "kill"):
            what, ready = "aimed at a bulk message waiting in Redis", self._bulk_waiting
        else:
            return ""
        # The random load seldom has a bulk export running and never more in flight than
        # children for long, so a message waits in Redis only by luck: ask the load for as
        # many bulk exports as the tenant may have in flight (accepted and checked like
        # any other), then wait for the work to be there.
        if self.load is not None and not self._ready_now(ready):
            for _ in range(self.options.bulk_in_flight):
                self.load.enqueue({"all": True, "format": "json"})
        deadline = time.time() + self.options.aim_seconds
        while not self._stop.is_set() and time.time() < deadline:
            with contextlib.suppress(Exception):  # a server coming back: not yet
                if ready():
                    return what
            time.sleep(0.1)
        return f"not {what} (none within {self.options.aim_seconds:.0f} s)"

    @staticmethod
    def _ready_now(ready: Callable[[], bool]) -> bool:
        with contextlib.suppress(Exception):  # a server coming back: not yet
            return ready()
        return False

    def _bulk_running(self) -> bool:
        return bool(
            self.env.db.scalar(
                "SELECT count(*) FROM export_jobs WHERE status = 'running'"
                " AND queue = 'exports.bulk'"
            )
        )

    def _bulk_waiting(self) -> bool:
        return bool(self.env.queued_messages("exports.bulk"))

    @staticmethod
    def _actions(target: str) -> list[str]:
        if target == "postgres":
            return ["crash", "stall"]
        return ["kill", "stall"]

    def _stall_seconds(self) -> float:
        # Up to one and a half leases: some stalls outlive the lease, most do not.
        return self.rng.uniform(0.5, self.options.settings.lease_seconds * 1.5)

    def _pause(self, pids: list[int], seconds: float) -> None:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            for pid in pids:
                if pid_alive(pid):
                    os.kill(pid, signal.SIGCONT)

    def _inject(self, event: ChaosEvent) -> None:
        env, target = self.env, event.target
        if target in APP_PROCESSES:
            proc = env.proc(target)
            event.pids = [proc.pid, *proc.children()]
            if event.action == "kill":  # the container dies: its whole process group
                proc.signal(signal.SIGKILL, group=True)
                proc.wait(10)
                took = env.start_process(target)
                event.detail = f"restarted in {took:.2f} s"
            else:
                seconds = self._stall_seconds()
                event.detail = f"stopped {seconds:.2f} s"
                proc.signal(signal.SIGSTOP, group=True)
                try:
                    time.sleep(seconds)
                finally:
                    proc.signal(signal.SIGCONT, group=True)
        elif target.endswith("-child"):
            name = target.removesuffix("-child")
            children = env.children_of(name)
            if not children:
                event.detail = "no child at that moment"
                return
            pid = self.rng.choice(children)
            event.pids = [pid]
            if event.action == "kill":  # one prefork child OOM-killed inside its container
                env.signal_child(name, pid, signal.SIGKILL)
                event.detail = "the worker replaces it"
            else:
                seconds = self._stall_seconds()
                event.detail = f"stopped {seconds:.2f} s"
                self._pause([pid], seconds)
        elif target == "redis" and env.topology == "ha":
            old, pid = env.ha.redis.kill_master()
            event.pids = [pid]
            new, _ = env.ha.redis.wait_new_master(old, 60)
            env.ensure_servers()  # the old master comes back as a replica
            event.detail = f"master {old} killed; Sentinel promoted {new}"
        elif target == "redis":
            server = env.redis_pid()
            if server is None:
                raise RuntimeError("redis pid unknown")
            event.pids = [server]
            if event.action == "kill":  # its messages are gone: no persistence
                os.kill(server, signal.SIGKILL)
                wait_for(lambda: not pid_alive(server), 10, "redis to die")
                env.servers.start_redis()
                event.detail = "restarted empty"
            else:
                seconds = self._stall_seconds()
                event.detail = f"stopped {seconds:.2f} s"
                self._pause([server], seconds)
        elif target == "postgres":
            postmaster = env.postgres_pid()
            if postmaster is None:
                raise RuntimeError("postmaster pid unknown")
            if event.action == "crash":
                event.pids = [postmaster]
                crash_postgres(env)
                env.servers.start_pg()
                event.detail = "pg_ctl stop -m immediate, then start (crash recovery)"
            else:
                pids = [postmaster, *_children(postmaster)]
                event.pids = pids
                seconds = self._stall_seconds()
                event.detail = (
                    f"postmaster and its {len(pids) - 1} backends stopped {seconds:.2f} s"
                )
                self._pause(pids, seconds)


def pg_ctl_path() -> str:
    """The ``pg_ctl`` that ``scripts/localstack.sh`` uses (PG_VERSION, else any installed)."""
    version = os.environ.get("PG_VERSION", "15")
    candidates = [Path(f"/usr/lib/postgresql/{version}/bin/pg_ctl")]
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), reverse=True)
    for c in candidates:
        if c.exists():
            return str(c)
    found = shutil.which("pg_ctl")
    if not found:
        raise RuntimeError("pg_ctl not found (install the postgresql package)")
    return found


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def crash_postgres(env: DrillEnvironment) -> None:
    """``pg_ctl stop -m immediate`` on our cluster: every server process ends at once, the
    next start runs crash recovery (what a killed container does to PostgreSQL)."""
    data = env.servers.base / "pg" / "data"
    cmd = [pg_ctl_path(), "-D", str(data), "-m", "immediate", "-w", "stop"]
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    subprocess.run(cmd, check=True, capture_output=True)


# --- verification --------------------------------------------------------------------------


class _Sink:
    """A renderer sink that keeps the bytes (to compare with the stored artifact)."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()

    def write(self, data: bytes, /) -> int:
        return self.buf.write(data)

    def tell(self) -> int:
        return self.buf.tell()

    def flush(self) -> None:
        return None


def rerender(env: DrillEnvironment, job: dict[str, Any]) -> bytes:
    """Render the job's immutable snapshot again, in this process, each item read at its
    recorded note version (:func:`devtools.render_check.snapshot_chunks`)."""
    fmt = ExportFormat(job["format"])
    sink = _Sink()
    renderer = make_renderer(fmt, sink)
    renderer.begin(ExportHeader.of_job(job))
    with psycopg.connect(env.db.database_url, row_factory=dict_row) as conn:
        for rows in snapshot_chunks(conn, job["id"], env.settings.render_chunk_size):
            renderer.add([NoteRecord.from_row(r) for r in rows])
    renderer.end()
    return sink.buf.getvalue()


def _zip_entries(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def verify_artifact(env: DrillEnvironment, job: dict[str, Any]) -> str | None:
    """None when the published artifact reads back with the recorded sha256 and equals a
    fresh rendering of the snapshot (zip: the same entries with the same bytes; zip entry
    times differ by design); otherwise what is wrong."""
    try:
        stream, size = env.store.open_reader(job["result_ref"])
        with stream:
            data = stream.read()
    except Exception as exc:
        return f"unreadable: {type(exc).__name__}: {exc}"
    if len(data) != size or hashlib.sha256(data).hexdigest() != job["result_sha256"]:
        return "sha256 or size differs from the recorded one"
    fresh = rerender(env, job)
    if job["format"] == "markdown_zip":
        if _zip_entries(data) != _zip_entries(fresh):
            return "zip entries differ from a fresh rendering"
    elif data != fresh:
        return "bytes differ from a fresh rendering"
    return None


def fault_overlap(events: Sequence[ChaosEvent], a: float, b: float) -> float:
    """Seconds of faults overlapping [a - QUIET_BEFORE_SECONDS, b], plus that quiet time
    itself when any fault overlapped (0.0 when the window was undisturbed)."""
    start = a - QUIET_BEFORE_SECONDS
    hit = [e for e in events if e.started <= b and (e.ended or e.started) >= start]
    if not hit:
        return 0.0
    seconds = sum(min(e.ended or e.started, b) - max(e.started, start) for e in hit)
    return round(seconds + QUIET_BEFORE_SECONDS, 3)


def recovery_windows(
    env: DrillEnvironment, tenant_id: str, events: Sequence[ChaosEvent]
) -> dict[str, Any]:
    """Every lease recovery and lost-dispatch recovery in the tenant's histories."""
    s = env.settings
    rows = env.db.sql(
        "SELECT e.job_id, e.at, e.kind, e.lease_token, e.detail FROM export_job_events e"
        " JOIN export_jobs j ON j.id = e.job_id WHERE j.tenant_id = %s ORDER BY e.job_id, e.id",
        (tenant_id,),
    )
    by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_job[str(r["job_id"])].append(r)
    lease: list[dict[str, Any]] = []
    dispatch: list[dict[str, Any]] = []
    for job_id, history in by_job.items():
        life: dict[str, float] = {}
        last_dispatch: float | None = None
        for i, e in enumerate(history):
            at = e["at"].timestamp()
            if e["kind"] == "submitted":
                last_dispatch = at
            if e["kind"] in ("claimed", "renewed") and e["lease_token"]:
                life[str(e["lease_token"])] = at
            if e["kind"] == "lease_expired" and str(e["lease_token"]) in life:
                sign = life[str(e["lease_token"])]
                nxt = next((x for x in history[i:] if x["kind"] == "claimed"), None)
                lease.append(
                    {
                        "job_id": job_id,
                        "claimable": round(at - sign, 3),
                        "claimed_again": round(nxt["at"].timestamp() - sign, 3) if nxt else None,
                        "budget": round(s.lease_recovery_budget, 3),
                        "fault_overlap": fault_overlap(events, sign, at),
                    }
                )
            if e["kind"] == "redispatched" and last_dispatch is not None:
                count = int(e["detail"].get("dispatch_count") or 1)
                nxt = next((x for x in history[i:] if x["kind"] == "claimed"), None)
                dispatch.append(
                    {
                        "job_id": job_id,
                        "redispatched": round(at - last_dispatch, 3),
                        "claimed": round(nxt["at"].timestamp() - last_dispatch, 3) if nxt else None,
                        "budget": round(s.dispatch_recovery_budget(count), 3),
                        "fault_overlap": fault_overlap(events, last_dispatch, at),
                    }
                )
            if e["kind"] in ("dispatched", "redispatched"):
                last_dispatch = at
    return {"lease": lease, "dispatch": dispatch}


def untested_recoveries(windows: Mapping[str, Sequence[Any]], targets: Iterable[str]) -> list[str]:
    """The recoveries a soak should have recorded and did not (empty: it tested recovery):
    ``lease`` when the chaos targeted the bulk worker or its child and ``windows`` (from
    :func:`recovery_windows`) holds no lease recovery, ``dispatch`` when it targeted Redis
    and holds no lost-dispatch recovery."""
    targets = set(targets)
    needed = {
        "lease": bool(targets & {"bulk-worker", "bulk-worker-child"}),
        "dispatch": "redis" in targets,
    }
    return [kind for kind, need in needed.items() if need and not windows.get(kind)]


def _worst(items: list[dict[str, Any]], key: str) -> float | None:
    values = [x[key] for x in items if x.get(key) is not None]
    return max(values) if values else None


# --- the soak ------------------------------------------------------------------------------


def run_soak(
    options: SoakOptions,
    out_dir: Path,
    *,
    say: Callable[[str], None] = print,
    env: DrillEnvironment | None = None,
) -> SoakResult:
    """Run the soak (on ``env``, or on a new environment) and write ``soak.json``."""
    if env is None:
        topology: Topology = "ha" if options.failovers else "single"
        with DrillEnvironment(
            options.settings, artifact_tmpfs=False, say=say, topology=topology
        ) as own:
            return _soak(own, options, out_dir, say)
    return _soak(env, options, out_dir, say)


def _soak(
    env: DrillEnvironment, options: SoakOptions, out_dir: Path, say: Callable[[str], None]
) -> SoakResult:
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(10**6)
    rng = random.Random(seed)
    tenant = env.new_tenant("soak")
    say(
        f"soak: {options.duration:.0f} s of chaos at {options.rate}/s, a fault every "
        f"{options.chaos_min}-{options.chaos_max} s, seed {seed}, tenant {tenant.id}"
    )
    env.db.sql(
        "UPDATE tenants SET bulk_in_flight = %s WHERE id = %s", (options.bulk_in_flight, tenant.id)
    )
    slow = slow_bulk_exports(env, options.slow_chunk_seconds, options.bulk_children)
    try:
        return _soak_with_slow_bulk(env, options, out_dir, say, tenant, seed, rng)
    finally:
        slow()


def slow_bulk_exports(env: DrillEnvironment, seconds: float, children: int) -> Callable[[], None]:
    """Restart the bulk worker with ``children`` prefork children and a failpoints file of
    its own that stalls every render chunk ``seconds`` (``render.chunk``, ``sleep``), so that
    every bulk export runs for seconds and a kill or a long stall of the bulk worker lands
    inside one (the other processes keep the stack's file); the children keep the bulk
    queue's load below its capacity. Returns the undo: the bulk worker restarted with the
    stack's environment again."""
    path = env.base / "faults-soak-bulk.json"
    path.write_text("{}")
    faults.arm(path, "render.chunk", f"sleep:{seconds}", times=10**9)
    env.restart_with(
        "bulk-worker", **{faults.ENV: str(path), "BULK_WORKER_CONCURRENCY": str(children)}
    )
    return lambda: env.restore_env("bulk-worker")


def _soak_with_slow_bulk(
    env: DrillEnvironment,
    options: SoakOptions,
    out_dir: Path,
    say: Callable[[str], None],
    tenant: Tenant,
    seed: int,
    rng: random.Random,
) -> SoakResult:
    s = env.settings
    cancels: list[tuple[str, int | str]] = []
    load = LoadGenerator(
        env,
        tenant,
        options.rate,
        threads=max(4, int(options.rate * 2)),
        bulk_share=options.bulk_share,
        max_notes=options.max_notes,
        seed=seed,
    )
    load.on_accepted = _canceller(env, tenant, options.cancel_share, rng, cancels)
    started = time.time()
    load.start()
    chaos = Chaos(env, options, rng, load).start()
    failovers = (
        FailoverLoop(
            env,
            options.failover_every,
            lambda t, a, s0, s1, d, err: chaos.events.append(ChaosEvent(t, a, s0, s1, [], d, err)),
        ).start()
        if options.failovers
        else None
    )
    last_report = started
    while time.time() - started < options.duration:
        time.sleep(min(1.0, max(0.0, options.duration - (time.time() - started))))
        if time.time() - last_report >= 30:
            last_report = time.time()
            say(
                f"  t={last_report - started:4.0f} s accepted {len(load.accepted)}"
                f" answers {outcome_counts(load.attempts)} faults {len(chaos.events)}"
            )
    if failovers is not None:
        failovers.stop()
    chaos.stop()
    restored = {"servers": env.ensure_servers(), "processes": env.ensure_running()}
    chaos_end = time.time()
    load.stop()
    load_end = time.time()
    say(f"chaos stopped after {len(chaos.events)} faults; restored {restored}; settling")
    accepted_ids = [a.job_id for a in load.accepted if a.job_id]
    by_key = env.jobs_for_keys(tenant.id, [a.key for a in load.attempts])
    unanswered = sorted({by_key[a.key] for a in load.refused if a.key in by_key})
    committed = sorted(set(accepted_ids) | set(unanswered))
    # The backlog at the measured throughput, per queue: a bulk export runs for seconds, a
    # small one for milliseconds, so the fast queue's rate says nothing of the bulk backlog.
    elapsed = max(1.0, load_end - started)
    by_queue = env.db.sql(
        "SELECT queue, count(*) FILTER (WHERE status IN ('queued', 'running')) AS active,"
        " count(*) FILTER (WHERE status IN ('succeeded', 'failed', 'cancelled')) AS done"
        " FROM export_jobs WHERE tenant_id = %s GROUP BY queue",
        (tenant.id,),
    )
    active_at_end = sum(int(r["active"]) for r in by_queue)
    backlog_allowance = {
        str(r["queue"]): int(r["active"]) / max(0.5, int(r["done"]) / elapsed) for r in by_queue
    }
    worst_budget = finish_budget(max(s.lease_recovery_budget, s.dispatch_recovery_budget(99)))
    settle_deadline = chaos_end + worst_budget + max(backlog_allowance.values(), default=0.0)

    def active() -> int:
        return int(
            env.db.scalar(
                "SELECT count(*) FROM export_jobs WHERE tenant_id = %s"
                " AND status IN ('queued', 'running')",
                (tenant.id,),
            )
        )

    # Wait past the budget if need be (then the verification says who was late or lost).
    with contextlib.suppress(AssertionError):
        wait_for(
            lambda: active() == 0,
            max(5.0, settle_deadline - time.time()) + 120,
            "every export to settle",
            interval=0.5,
        )
    settled_at = time.time()
    say(f"settled {settled_at - chaos_end:.1f} s after the chaos stopped; verifying")
    summary, checks = _verify(
        env,
        tenant,
        options,
        load,
        chaos.events,
        committed=committed,
        unanswered=unanswered,
        chaos_end=chaos_end,
        backlog_allowance=backlog_allowance,
        cancels=cancels,
    )
    summary.update(
        {
            "seed": seed,
            "started_at": now_iso(started),
            "duration_seconds": options.duration,
            "rate_per_second": options.rate,
            "restored_after_chaos": restored,
            "active_at_chaos_end": active_at_end,
            "backlog_allowance_seconds": {q: round(v, 3) for q, v in backlog_allowance.items()},
            "settle_seconds": round(settled_at - chaos_end, 3),
            "slow_chunk_seconds": options.slow_chunk_seconds,
            "bulk_in_flight": options.bulk_in_flight,
            "environment": str(env.base),
            **(failover_report(failovers.failovers, load.attempts) if failovers else {}),
        }
    )
    passed = all(c.ok for c in checks) and bool(checks)
    summary["passed"] = passed
    summary["checks"] = [asdict(c) for c in checks]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "soak.json").write_text(json.dumps(jsonable(summary), indent=2) + "\n")
    headline = {k: summary[k] for k in summary if not isinstance(summary[k], dict | list)}
    print_table(mapping_table("chaos soak", headline))
    print_table(mapping_table("worst recovery times (s)", summary["recovery"]))
    for c in checks:
        say(f"  [{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail[:300]}")
    say(f"soak {'PASSED' if passed else 'FAILED'}; report {out_dir / 'soak.json'}")
    return SoakResult(passed, checks, summary)


def _canceller(
    env: DrillEnvironment,
    tenant: Tenant,
    share: float,
    rng: random.Random,
    cancels: list[tuple[str, int | str]],
) -> Callable[[Attempt], None]:
    """Cancel a share of the accepted bulk exports right away (queued or running, or
    already done: then the answer is 409)."""
    lock = threading.Lock()

    def maybe_cancel(a: Attempt) -> None:
        if not a.body.get("all"):
            return
        with lock:
            if rng.random() >= share:
                return
        try:
            with tenant.api.http(timeout=30) as c:
                r = c.post(f"/v1/exports/{a.job_id}/cancel")
            result: int | str = r.status_code
        except httpx.HTTPError as exc:
            result = type(exc).__name__
        with lock:
            cancels.append((str(a.job_id), result))

    return maybe_cancel


def _verify(
    env: DrillEnvironment,
    tenant: Tenant,
    options: SoakOptions,
    load: LoadGenerator,
    events: Sequence[ChaosEvent],
    *,
    committed: list[str],
    unanswered: list[str],
    chaos_end: float,
    backlog_allowance: dict[str, float],
    cancels: list[tuple[str, int | str]],
) -> tuple[dict[str, Any], list[Check]]:
    s = env.settings
    checks: list[Check] = []

    def check(name: str, ok: bool, detail: Any = "") -> None:
        checks.append(Check(name, bool(ok), str(detail)[:2000]))

    accepted = [a.job_id for a in load.accepted if a.job_id]
    jobs = {
        str(r["id"]): r
        for r in env.db.sql("SELECT * FROM export_jobs WHERE tenant_id = %s", (tenant.id,))
    }
    events_by_job: dict[str, Counter[str]] = defaultdict(Counter)
    for r in env.db.sql(
        "SELECT e.job_id, e.kind, count(*) AS n FROM export_job_events e JOIN export_jobs j"
        " ON j.id = e.job_id WHERE j.tenant_id = %s GROUP BY e.job_id, e.kind",
        (tenant.id,),
    ):
        events_by_job[str(r["job_id"])][r["kind"]] = int(r["n"])
    statuses = Counter(jobs[j]["status"] if j in jobs else "<missing>" for j in accepted)
    by_key = env.jobs_for_keys(tenant.id, [a.key for a in load.accepted])
    missing = [
        a.job_id for a in load.accepted if a.job_id not in jobs or by_key.get(a.key) != a.job_id
    ]
    lost = [
        j
        for j in committed
        if j not in jobs or jobs[j]["status"] not in ("succeeded", "failed", "cancelled")
    ]
    check(
        "every 202 names an existing export, committed with the request's key",
        not missing,
        f"missing: {missing[:5]}",
    )
    check(
        "accepted = succeeded + failed + cancelled (nothing lost, nothing unfinished)",
        len(accepted) == statuses["succeeded"] + statuses["failed"] + statuses["cancelled"]
        and not lost,
        f"accepted {len(accepted)}, {dict(statuses)}, not terminal: {lost[:5]}",
    )
    late: list[dict[str, Any]] = []
    settle_times: list[float] = []
    for j in committed:
        row = jobs.get(j)
        if row is None or row["finished_at"] is None:
            continue
        after = row["finished_at"].timestamp() - chaos_end
        budget = finish_budget(
            max(s.lease_recovery_budget, s.dispatch_recovery_budget(row["dispatch_count"]))
        ) + backlog_allowance.get(row["queue"], 0.0)
        if after > 0:
            settle_times.append(after)
            if after > budget:
                late.append(
                    {"job_id": j, "after_chaos": round(after, 2), "budget": round(budget, 2)}
                )
    check(
        "every export still active when the chaos stopped ended within its recovery budget",
        not late and not lost,
        late[:5] or f"worst {max(settle_times, default=0):.2f} s after the chaos stopped",
    )
    twice = [j for j, c in events_by_job.items() if c["succeeded"] > 1]
    check("no export has two succeeded events", not twice, twice[:5])
    over = [
        j
        for j, r in jobs.items()
        if r["attempts"] > r["max_attempts"] or events_by_job[j]["claimed"] > r["max_attempts"]
    ]
    check("attempts never exceed the maximum", not over, over[:5])
    succeeded = [r for r in jobs.values() if r["status"] == "succeeded"]
    bad: list[str] = []
    for r in succeeded:
        problem = verify_artifact(env, r)
        if problem:
            bad.append(f"{r['id']}: {problem}")
    check(
        "every succeeded export has exactly one published artifact, read back with its sha256"
        " and equal to a fresh rendering of its snapshot",
        not bad and all(events_by_job[str(r["id"])]["succeeded"] == 1 for r in succeeded),
        bad[:5] or f"{len(succeeded)} artifacts verified",
    )
    unpublished = [
        j for j, r in jobs.items() if r["status"] in ("failed", "cancelled") and r["result_ref"]
    ]
    check("failed and cancelled exports publish nothing", not unpublished, unpublished[:5])
    failed = [r for r in jobs.values() if r["status"] == "failed"]
    dead = {
        str(r["job_id"])
        for r in env.db.sql(
            "SELECT job_id FROM export_dead_letters WHERE tenant_id = %s", (tenant.id,)
        )
    }
    undead = [str(r["id"]) for r in failed if str(r["id"]) not in dead]
    check("every failed export has a dead letter", not undead, undead[:5])
    windows = recovery_windows(env, tenant.id, events)
    lease_over = [w for w in windows["lease"] if w["claimable"] > w["budget"] + w["fault_overlap"]]
    dispatch_over = [
        w for w in windows["dispatch"] if w["redispatched"] > w["budget"] + w["fault_overlap"]
    ]
    undisturbed = sum(
        not w["fault_overlap"] for kind in ("lease", "dispatch") for w in windows[kind]
    )
    check(
        "the soak tested recovery: it recorded lease recoveries and lost-dispatch recoveries"
        " (required when the bulk worker and Redis are chaos targets)",
        not untested_recoveries(windows, options.components or COMPONENTS),
        f"{len(windows['lease'])} lease recoveries, {len(windows['dispatch'])} lost-dispatch"
        f" recoveries; aimed faults: {sum(1 for e in events if e.detail.startswith('aimed'))}",
    )
    check(
        "every lease recovery was claimable within lease + scan + backoff cap (extended by"
        " the faults that overlapped it)",
        not lease_over,
        lease_over[:5] or f"{len(windows['lease'])} lease recoveries",
    )
    check(
        "every lost dispatch was re-dispatched within threshold + scan (extended by the"
        " faults that overlapped it)",
        not dispatch_over,
        dispatch_over[:5]
        or f"{len(windows['dispatch'])} re-dispatches; {undisturbed} windows undisturbed",
    )
    env.logs.refresh()
    job_ids = set(jobs)
    refusals = Counter(
        r.get("reason")
        for r in env.logs.matching("claim refused")
        if str(r.get("job_id")) in job_ids
    )
    stored = _store_census(env, tenant.id, jobs)
    by_target: dict[str, Counter[str]] = defaultdict(Counter)
    for e in events:
        by_target[e.target][e.action] += 1
    summary: dict[str, Any] = {
        "accepted": len(accepted),
        "succeeded": statuses["succeeded"],
        "failed": statuses["failed"],
        "cancelled": statuses["cancelled"],
        "lost": len(lost),
        "duplicated": len(twice),
        "committed_without_an_answer": len(unanswered),
        "answers": outcome_counts(load.attempts),
        "failed_by_reason": dict(Counter(r["error_code"] for r in failed)),
        "cancel_requests": dict(Counter(str(c[1]) for c in cancels)),
        "duplicate_deliveries_refused": dict(refusals),
        "redispatched": sum(c["redispatched"] for c in events_by_job.values()),
        "lease_expiries": sum(c["lease_expired"] for c in events_by_job.values()),
        "max_dispatch_count": max((r["dispatch_count"] for r in jobs.values()), default=0),
        "max_attempts_used": max((r["attempts"] for r in jobs.values()), default=0),
        "stored_objects": stored,
        "faults": len(events),
        "faults_by_target": {k: dict(v) for k, v in sorted(by_target.items())},
        "fault_errors": [asdict(e) for e in events if e.error],
        "recovery": {
            "lease_claimable_worst": _worst(windows["lease"], "claimable"),
            "lease_claimed_again_worst": _worst(windows["lease"], "claimed_again"),
            "lease_budget": round(s.lease_recovery_budget, 3),
            "lease_recoveries": len(windows["lease"]),
            "lease_over_plain_budget": sum(w["claimable"] > w["budget"] for w in windows["lease"]),
            "dispatch_redispatched_worst": _worst(windows["dispatch"], "redispatched"),
            "dispatch_claimed_worst": _worst(windows["dispatch"], "claimed"),
            "dispatch_budget_first_loss": round(s.dispatch_recovery_budget(1), 3),
            "dispatch_recoveries": len(windows["dispatch"]),
            "dispatch_over_plain_budget": sum(
                w["redispatched"] > w["budget"] for w in windows["dispatch"]
            ),
            "settle_worst_after_chaos": round(max(settle_times, default=0.0), 3),
        },
        "recovery_windows_over_budget": [
            w for w in windows["lease"] if w["claimable"] > w["budget"]
        ]
        + [w for w in windows["dispatch"] if w["redispatched"] > w["budget"]],
        "settings": s.as_dict(),
        "budgets": s.budgets(),
        "chaos": [asdict(e) for e in events],
    }
    return summary, checks


def _store_census(env: DrillEnvironment, tenant_id: str, jobs: dict[str, Any]) -> dict[str, int]:
    """What the store holds for the tenant: published artifacts, and other objects (files of
    leases that did not win, partial files of killed workers) that are never served and that
    the scanner's orphan cleanup deletes after ``ORPHAN_GRACE_SECONDS``."""
    from datetime import UTC, datetime, timedelta

    published = {r["result_ref"] for r in jobs.values() if r["result_ref"]}
    counts: Counter[str] = Counter()
    for key, _ in env.store.list_older_than(datetime.now(UTC) + timedelta(days=1)):
        if not key.startswith(tenant_id + "/"):
            continue
        counts["published" if key in published else "not_published"] += 1
    return dict(counts)
