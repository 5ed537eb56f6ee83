"""Flat figures (min / median / max over runs), ratios to the peers, targets, the table."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import pgstats
from bench.common import spread

PEERS = ("celery", "procrastinate", "pgqueuer-psycopg", "pgqueuer-asyncpg")
DURABLE_PEERS = ("procrastinate", "pgqueuer-psycopg", "pgqueuer-asyncpg")
OURS = ("ours-lib", "ours-lib-warning", "ours-http")
# Phases of the e2e scenario measured with the equal-footing accounting (bench/e2e.py).
PHASES = ("sat", "idle", "at50", "noisy", "at80")
CPU_MS_PER_JOB_TARGET = 3.0
COMMITS_PER_JOB_TARGET = 3.0
PICKUP_P99_AT100_MS = 10.0
E2E_P99_AT100_MS = 25.0

UNITS = {
    "jobs_per_s": "jobs/s",
    "enqueue_per_s": "jobs/s",
    "cpu_ms_per_job": "ms",
    "machine_cpu_ms_per_job": "ms",
    "pg_commits_per_job": "commits",
    "commits_per_job": "commits",
    "client_cpu_ms_per_job": "ms",
    "postgres_cpu_ms_per_job": "ms",
    "notes_per_s": "notes/s",
    "peak_rss_mb": "MB",
    "rate": "req/s",
    "seconds_to_all_succeeded": "s",
    "leases_killed": "leases",
    "messages_at_return": "messages",
    "max_concurrent": "requests",
    "concurrency_bound": "requests",
    "drain_per_s": "msg/s",
    "seq_scans_of_big_tables": "statements",
    "concurrency": "executions",
    "max_concurrent_executions": "executions",
    "write_commits_per_job": "xacts",
    "wal_bytes_per_job": "bytes",
    "cpu_ms_per_job_at50": "ms",
    "e2e_p99_noisy_ratio": "x",
    "jobs_per_claim": "jobs",
    "pg_exec_ms_per_job": "ms",
    "pg_plan_ms_per_job": "ms",
    "pg_statement_wal_bytes_per_job": "bytes",
}
# The phases whose statements and table writes are recorded (``pg`` of bench/e2e.py).
PG_PHASES = ("sat", "at50")


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def figures(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{name: {unit, values, min, median, max}}`` for every measured figure."""
    per: dict[str, list[Any]] = defaultdict(list)
    sc = results.get("scenarios", {})
    for system, runs in (_get(sc, "e2e", "systems") or {}).items():
        for r in runs:
            base = f"e2e.{system}"
            per[f"{base}.jobs_per_s"].append(r.get("jobs_per_s"))
            per[f"{base}.enqueue_per_s"].append(r.get("enqueue_per_s"))
            per[f"{base}.cpu_ms_per_job"].append(r.get("cpu_ms_per_job"))
            per[f"{base}.machine_cpu_ms_per_job"].append(r.get("machine_cpu_ms_per_job"))
            per[f"{base}.pg_commits_per_job"].append(r.get("pg_commits_per_job"))
            for phase, key in (("sat", "saturation_pickup"), ("sat", "saturation_e2e")):
                kind = key.split("_")[1]
                for p in ("p50_ms", "p99_ms"):
                    per[f"{base}.{phase}.{kind}_{p}"].append(_get(r, key, p))
            for kind in ("pickup", "e2e"):
                for p in ("p50_ms", "p99_ms"):
                    per[f"{base}.at{_rate(r)}.{kind}_{p}"].append(_get(r, "fixed_rate", kind, p))
                    per[f"{base}.open80.{kind}_{p}"].append(_get(r, "open80", kind, p))
            per[f"{base}.open80.rate"].append(_get(r, "open80", "target_per_s"))
            sizes = r.get("saturation_batch_sizes") or {}
            if sizes:
                jobs = sum(int(n) * c for n, c in sizes.items())
                per[f"{base}.sat.jobs_per_claim"].append(jobs / max(1, sum(sizes.values())))
            for name, value in footing_figures(r).items():
                per[f"{base}.{name}"].append(value)
    for r in _get(sc, "costs", "runs") or []:
        for variant, res in r.items():
            if not isinstance(res, dict):
                continue
            for stage in ("submit", "submit_concurrent", "publish", "work", "total"):
                for k in ("client_cpu_ms_per_job", "postgres_cpu_ms_per_job", "commits_per_job"):
                    per[f"costs.{variant}.{stage}.{k}"].append(_get(res, stage, k))
            per[f"costs.{variant}.submit_concurrent.wall_ms_per_job"].append(
                _get(res, "submit_concurrent", "wall_ms_per_job")
            )
    for r in _get(sc, "api", "runs") or []:
        best = _get(r, "max", "best") or {}
        per["api.max.rate"].append(best.get("rate"))
        per["api.max.p50_ms"].append(best.get("p50_ms"))
        per["api.max.p99_ms"].append(best.get("p99_ms"))
        fixed = r.get("fixed") or {}
        rate = int(fixed.get("target_per_s") or 0)
        for p in ("p50_ms", "p99_ms", "p999_ms"):
            per[f"api.at{rate}.{p}"].append(fixed.get(p))
    for fmt, runs in (_get(sc, "bulk", "formats") or {}).items():
        for r in runs:
            for k in ("notes_per_s", "peak_rss_mb", "submit_seconds", "render_seconds"):
                per[f"bulk.{fmt}.{k}"].append(r.get(k))
    per["bulk.delta.ratio"].append(_get(sc, "bulk", "delta", "ratio"))
    for r in _get(sc, "scale", "runs") or []:
        for db in ("empty", "full", "active"):
            for op in ("submit", "claim"):
                for p in ("p50_ms", "p99_ms"):
                    per[f"scale.{db}.{op}_{p}"].append(_get(r, db, op, p))
            per[f"scale.{db}.scanner_pass_ms"].append(_get(r, db, "scanner_pass_ms"))
            per[f"scale.{db}.scanner_hygiene_pass_ms"].append(
                _get(r, db, "scanner_hygiene_pass_ms")
            )
    for r in _get(sc, "console", "runs") or []:
        for case, fig in (r.get("pages") or {}).items():
            for p in ("p50_ms", "p99_ms"):
                per[f"console.{case}.{p}"].append(fig.get(p))
        per["console.seq_scans_of_big_tables"].append(len(r.get("seq_scans") or {}))
    for r in _get(sc, "recovery", "runs") or []:
        per["recovery.seconds_to_all_succeeded"].append(r.get("seconds_to_all_succeeded"))
        per["recovery.budget_seconds"].append(r.get("budget_seconds"))
        per["recovery.leases_killed"].append(r.get("leases"))
    for r in _get(sc, "webhooks", "runs") or []:
        rate = int(r.get("rate") or 0)
        for p in ("p50_ms", "p99_ms"):
            per[f"webhooks.at{rate}.commit_to_receiver_{p}"].append(_get(r, "latency", p))
        per["webhooks.backlog.drain_seconds"].append(r.get("drain_seconds"))
        per["webhooks.backlog.messages_at_return"].append(r.get("backlog_at_return"))
        per["webhooks.backlog.max_concurrent"].append(r.get("max_concurrent_at_receiver"))
        per["webhooks.backlog.concurrency_bound"].append(r.get("endpoint_concurrency_bound"))
        per["webhooks.backlog.drain_per_s"].append(r.get("drain_rate_per_s"))
        for kind in ("no_endpoint", "one_endpoint"):
            per[f"webhooks.trigger.{kind}_us_per_job"].append(
                _get(r, "trigger_cost", kind, "trigger_us_per_job")
            )
    fair = sc.get("fairness") or {}
    for phase in ("empty", "backlog"):
        for p in ("p50_s", "p99_s"):
            per[f"fairness.{phase}.victim_pickup_{p}"].append(_get(fair, phase, p))
    per["fairness.bulk_run_p50_s"].append(_get(fair, "bulk_run_seconds", "p50_s"))
    out = {}
    for name, values in per.items():
        if all(v is None for v in values):
            continue
        out[name] = {"unit": _unit(name), **spread(values)}
    return out


def footing_figures(r: dict[str, Any]) -> dict[str, float | None]:
    """The equal-footing figures of one e2e run of one system (``run_system``'s result):
    the headline names of docs/performance.md ("Equal footing") and the per-phase detail
    (``<phase>.<measure>``, phases sat, idle, at50, noisy, at80)."""
    out: dict[str, float | None] = {"concurrency": r.get("concurrency")}
    for phase in PHASES:
        for measure in ("cpu_ms_per_job", "write_commits_per_job", "wal_bytes_per_job"):
            out[f"{phase}.{measure}"] = _get(r, phase, measure)
        if phase != "sat":  # the saturation latencies keep their earlier names
            for kind in ("e2e", "pickup"):
                for p in ("p50_ms", "p99_ms"):
                    out[f"{phase}.{kind}_{p}"] = _get(r, phase, kind, p)
    for phase in PG_PHASES:
        top = _get(r, phase, "pg", "statements_top_level") or {}
        out[f"{phase}.pg_exec_ms_per_job"] = top.get("total_exec_time")
        out[f"{phase}.pg_plan_ms_per_job"] = top.get("total_plan_time")
        out[f"{phase}.pg_statement_wal_bytes_per_job"] = top.get("wal_bytes")
    out["cpu_ms_per_job_at50"] = _get(r, "at50", "cpu_ms_per_job")
    out["write_commits_per_job"] = _get(r, "sat", "write_commits_per_job")
    out["wal_bytes_per_job"] = _get(r, "sat", "wal_bytes_per_job")
    for frac in ("at50", "at80"):
        for p in ("p50", "p99"):
            out[f"e2e_{p}_ms_{frac}"] = _get(r, frac, "e2e", f"{p}_ms")
    out["e2e_p50_ms_idle"] = _get(r, "idle", "e2e", "p50_ms")
    quiet, noisy = _get(r, "at50", "e2e", "p99_ms"), _get(r, "noisy", "e2e", "p99_ms")
    out["e2e_p99_noisy_ratio"] = noisy / quiet if quiet and noisy is not None else None
    seen = [_get(r, ph, "max_concurrent_executions") for ph in PHASES]
    out["max_concurrent_executions"] = max((v for v in seen if v is not None), default=None)
    return out


def _rate(r: dict[str, Any]) -> int:
    return int(_get(r, "fixed_rate", "target_per_s") or 0)


def _unit(name: str) -> str:
    last = name.rsplit(".", 1)[-1]
    if last in UNITS:
        return UNITS[last]
    if last.endswith("_ms"):
        return "ms"
    if last.endswith("seconds") or last.endswith("_s"):
        return "s"
    return UNITS.get(last, "")


def ratios(figs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Ours / peer, run by run (the systems ran alternately, so drift cancels), then spread."""
    out = {}
    for ours in OURS:
        for peer in PEERS:
            for metric in ("jobs_per_s", "cpu_ms_per_job"):
                a = _get(figs, f"e2e.{ours}.{metric}", "values")
                b = _get(figs, f"e2e.{peer}.{metric}", "values")
                if not a or not b:
                    continue
                rs = [x / y for x, y in zip(a, b, strict=False) if x and y]
                if rs:
                    out[f"{ours}/{peer}.{metric}"] = spread(rs)
    return out


# The headline figures of the equal-footing table, and whether more is better.
HEADLINE: dict[str, bool] = {
    "jobs_per_s": True,
    "cpu_ms_per_job_at50": False,
    "write_commits_per_job": False,
    "wal_bytes_per_job": False,
    "e2e_p50_ms_at50": False,
    "e2e_p99_ms_at50": False,
    "e2e_p50_ms_at80": False,
    "e2e_p99_ms_at80": False,
    "e2e_p99_noisy_ratio": False,
    "e2e_p50_ms_idle": False,
}


def run_values(results: dict[str, Any], system: str, metric: str) -> list[float | None]:
    """``metric`` of ``system`` run by run (index = run; None where the run lacks it)."""
    runs = _get(results, "scenarios", "e2e", "systems", system) or []
    out: list[float | None] = []
    for r in runs:
        v = r.get(metric) if metric in ("jobs_per_s",) else footing_figures(r).get(metric)
        out.append(None if v is None else float(v))
    return out


def best_of(values: list[float | None], higher_is_better: bool) -> float | None:
    """The best of ``values`` (None skipped): the largest or the smallest."""
    vs = [v for v in values if v is not None]
    if not vs:
        return None
    return max(vs) if higher_is_better else min(vs)


def best_durable(results: dict[str, Any], metric: str, run: int) -> tuple[str, float] | None:
    """``(peer, value)`` of the best durable peer on ``metric`` in run ``run``."""
    cands = []
    for peer in DURABLE_PEERS:
        vals = run_values(results, peer, metric)
        v = vals[run] if run < len(vals) else None
        if v is not None:
            cands.append((peer, v))
    if not cands:
        return None
    pick = max if HEADLINE.get(metric, True) else min
    return pick(cands, key=lambda c: c[1])


def _reference(results: dict[str, Any], ref: str, metric: str, run: int) -> float | None:
    if ref == "best-durable":
        best = best_durable(results, metric, run)
        return None if best is None else best[1]
    vals = run_values(results, ref, metric)
    return vals[run] if run < len(vals) else None


def footing_ratios(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Ours / reference for every headline figure, run by run (the systems of one run ran
    one after another, so machine drift mostly cancels), then min / median / max. The
    references are every peer and ``best-durable``: in each run, the best of Procrastinate
    and both PgQueuers on that figure (the largest jobs/s, the smallest cost or latency)."""
    out: dict[str, dict[str, Any]] = {}
    systems = _get(results, "scenarios", "e2e", "systems") or {}
    ours = [s for s in systems if s.startswith("ours-")]
    for o in ours:
        for metric in HEADLINE:
            mine = run_values(results, o, metric)
            for ref in ("best-durable", *PEERS):
                rs = []
                for i, v in enumerate(mine):
                    r = _reference(results, ref, metric, i)
                    if v is not None and r:
                        rs.append(v / r)
                if rs:
                    out[f"{o}/{ref}.{metric}"] = spread(rs)
    return out


def footing_targets(results: dict[str, Any], ours: str = "ours-lib") -> list[dict[str, Any]]:
    """The targets of the equal-footing benchmark (docs/performance.md), each judged on the
    median over runs of its per-run ratio (or figure); a target whose figures are missing
    adds no row."""
    ratios = footing_ratios(results)
    figs = results.get("figures") or figures(results)
    out: list[dict[str, Any]] = []

    def add(name: str, threshold: str, value: float | None, met: bool, basis: str) -> None:
        out.append(
            {
                "target": name,
                "threshold": threshold,
                "value": None if value is None else round(value, 3),
                "met": met,
                "basis": basis,
            }
        )

    def ratio(key: str) -> float | None:
        median: float | None = _get(ratios, key, "median")
        return median

    per_run = "median over runs of the per-run ratio"
    for key, name, limit, at_least in (
        (
            f"{ours}/best-durable.jobs_per_s",
            f"{ours}: jobs/s at saturation / best durable peer",
            1.2,
            True,
        ),
        ("ours-http/celery.jobs_per_s", "ours-http: jobs/s / raw Celery", 0.8, True),
        (
            f"{ours}/pgqueuer-psycopg.cpu_ms_per_job_at50",
            f"{ours}: CPU ms per job at 50 % of own saturation / PgQueuer psycopg",
            1.0,
            False,
        ),
        (
            f"{ours}/celery.e2e_p99_ms_at50",
            f"{ours}: e2e p99 at 50 % of own saturation / raw Celery",
            1.5,
            False,
        ),
        (
            f"{ours}/pgqueuer-psycopg.wal_bytes_per_job",
            f"{ours}: WAL bytes per job / PgQueuer psycopg",
            1.5,
            False,
        ),
    ):
        v = ratio(key)
        if v is not None:
            sign = "≥" if at_least else "≤"
            add(name, f"{sign} {limit}x", v, v >= limit if at_least else v <= limit, per_run)
    noisy = _median(figs, f"e2e.{ours}.e2e_p99_noisy_ratio")
    if noisy is not None:
        peers = [_median(figs, f"e2e.{p}.e2e_p99_noisy_ratio") for p in PEERS]
        best = min((p for p in peers if p is not None), default=None)
        add(
            f"{ours}: e2e p99 with a noisy neighbour / quiet",
            f"≤ 2x and ≤ the best peer's ({'—' if best is None else f'{best:.2f}x'})",
            noisy,
            noisy <= 2.0 and (best is None or noisy <= best),
            "median over runs",
        )
    commits = _median(figs, f"e2e.{ours}.write_commits_per_job")
    if commits is not None:
        add(
            f"{ours}: write transactions per job at saturation",
            "≤ 2.5",
            commits,
            commits <= 2.5,
            "median over runs",
        )
    idle = _median(figs, f"e2e.{ours}.e2e_p50_ms_idle")
    if idle is not None:
        add(
            f"{ours}: an idle fast-lane export, submit → succeeded p50 (ms)",
            "≤ 30 ms",
            idle,
            idle <= 30.0,
            "median over runs",
        )
    return out


def e2e_table(results: dict[str, Any], run: int = 0) -> str:
    """The equal-footing table of one run as Markdown: each system's headline figures, then
    ours over the best durable peer and over raw Celery, figure by figure."""
    systems = list((_get(results, "scenarios", "e2e", "systems") or {}).keys())
    if not systems:
        return ""
    cols = [
        ("concurrency", "concurrency"),
        ("jobs_per_s", "jobs/s at saturation"),
        ("cpu_ms_per_job_at50", "CPU ms/job at 50 %"),
        ("write_commits_per_job", "write xacts/job (sat)"),
        ("wal_bytes_per_job", "WAL bytes/job (sat)"),
        ("e2e_p50_ms_at50", "e2e p50 at 50 %, ms"),
        ("e2e_p99_ms_at50", "e2e p99 at 50 %, ms"),
        ("e2e_p50_ms_at80", "e2e p50 at 80 %, ms"),
        ("e2e_p99_ms_at80", "e2e p99 at 80 %, ms"),
        ("e2e_p99_noisy_ratio", "p99 noisy / quiet"),
        ("e2e_p50_ms_idle", "e2e p50 idle, ms"),
    ]

    def cell(system: str, metric: str) -> float | None:
        vals = run_values(results, system, metric)
        return vals[run] if run < len(vals) else None

    def load(system: str) -> str:
        runs = _get(results, "scenarios", "e2e", "systems", system) or []
        r = runs[run] if run < len(runs) else {}
        before, after = r.get("loadavg_before"), r.get("loadavg_after")
        return f"{before[0]:.1f} → {after[0]:.1f}" if before and after else "—"

    lines = [
        "| system | " + " | ".join(label for _, label in cols) + " | load avg (1 min) |",
        "|---" * (len(cols) + 2) + "|",
    ]
    for sysname in systems:
        cells = " | ".join(_fmt(cell(sysname, m)) for m, _ in cols)
        lines.append(f"| {sysname} | {cells} | {load(sysname)} |")
    ours = [s for s in systems if s.startswith("ours-")]
    for ref, label in (("best-durable", "best durable peer"), ("celery", "raw Celery")):
        for o in ours:
            row = []
            for metric, _ in cols:
                if metric not in HEADLINE:
                    row.append("")
                    continue
                mine, theirs = cell(o, metric), _reference(results, ref, metric, run)
                row.append(f"{mine / theirs:.2f}x" if mine is not None and theirs else "—")
            lines.append(f"| {o} / {label} | " + " | ".join(row) + " | |")
    return "\n".join(lines) + "\n"


def pg_per_export(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{system: {phase: summary}}``: what PostgreSQL did per export in the phases
    :data:`PG_PHASES` of every e2e system, the median over runs of each statement's and
    each table's figures (:func:`bench.pgstats.summarize`)."""
    out: dict[str, dict[str, Any]] = {}
    for system, runs in (_get(results, "scenarios", "e2e", "systems") or {}).items():
        for phase in PG_PHASES:
            recorded = [pg for r in runs if (pg := _get(r, phase, "pg"))]
            if recorded:
                out.setdefault(system, {})[phase] = pgstats.summarize(recorded)
    return out


# Columns of the per-statement table: (counter, heading); every figure per export.
PG_STATEMENT_COLUMNS = (
    ("calls", "calls"),
    ("total_exec_time", "exec ms"),
    ("total_plan_time", "plan ms"),
    ("wal_bytes", "WAL bytes"),
    ("wal_fpi", "WAL FPI"),
    ("shared_blks_dirtied", "blocks dirtied"),
    ("rows", "rows"),
)
PG_TABLE_COLUMNS = (
    ("n_tup_ins", "inserted"),
    ("n_tup_upd", "updated"),
    ("n_tup_hot_upd", "of which HOT"),
    ("n_tup_del", "deleted"),
)


def _pg_cell(counter: str, v: float) -> str:
    if counter in pgstats.TIMES:
        return f"{v:.3f}"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}".rstrip("0").rstrip(".") or "0"


def pg_markdown(summary: dict[str, Any], top: int | None = None) -> str:
    """One system's phase (a :func:`pg_per_export` summary) as two Markdown tables, every
    figure per export: its statements, most WAL then most execution time first (``top``:
    only so many, the rest summed in one row), with the sum of the top-level ones (a nested
    statement's figures are also inside the top-level statement that ran it); then the
    rows its tables took."""
    heads = " | ".join(h for _, h in PG_STATEMENT_COLUMNS)
    lines = [
        f"| statement | level | {heads} |",
        "|---|---" + "|---:" * len(PG_STATEMENT_COLUMNS) + "|",
    ]
    stmts = summary.get("statements", [])
    shown = stmts if top is None else stmts[:top]
    for st in shown:
        cells = " | ".join(_pg_cell(c, st["per_export"][c]) for c, _ in PG_STATEMENT_COLUMNS)
        label = st["statement"].replace("|", "\\|")  # a pipe would end the cell
        name = f"`{label}`" if st.get("named") else label
        lines.append(f"| {name} | {st['level']} | {cells} |")
    rest = stmts[len(shown) :]
    if rest:
        summed = {
            c: sum(float(st["per_export"][c]) for st in rest if st["level"] == "top")
            for c, _ in PG_STATEMENT_COLUMNS
        }
        cells = " | ".join(_pg_cell(c, summed[c]) for c, _ in PG_STATEMENT_COLUMNS)
        lines.append(f"| {len(rest)} more (their top-level sum) | | {cells} |")
    total = summary.get("statements_top_level") or {}
    if total:
        cells = " | ".join(_pg_cell(c, float(total[c])) for c, _ in PG_STATEMENT_COLUMNS)
        lines.append(f"| **all top-level statements** | | {cells} |")
    lines += ["", "| table | " + " | ".join(h for _, h in PG_TABLE_COLUMNS) + " |"]
    lines.append("|---" + "|---:" * len(PG_TABLE_COLUMNS) + "|")
    for t in summary.get("tables", []):
        cells = " | ".join(_pg_cell(c, t["per_export"][c]) for c, _ in PG_TABLE_COLUMNS)
        lines.append(f"| {t['table']} | {cells} |")
    if not summary.get("tables"):
        lines.append("| (no table written) |" + " |" * len(PG_TABLE_COLUMNS))
    return "\n".join(lines) + "\n"


def print_pg(
    console: Console,
    per_export: dict[str, dict[str, Any]],
    systems: tuple[str, ...] = (),
    phases: tuple[str, ...] = PG_PHASES,
    top: int | None = 15,
) -> None:
    """Print :func:`pg_markdown` for each system (``systems``: only those) and phase."""
    for system, by_phase in per_export.items():
        if systems and system not in systems:
            continue
        for phase in phases:
            summary = by_phase.get(phase)
            if not summary:
                continue
            console.print(
                f"\n[bold]PostgreSQL per export: {system}, {phase}[/] "
                f"(median of {summary['runs']} run(s); pg_stat_statements, pg_stat_user_tables)"
            )
            console.print(pg_markdown(summary, top), markup=False, highlight=False, soft_wrap=True)


def _median(figs: dict[str, Any], name: str) -> float | None:
    median: float | None = _get(figs, name, "median")
    return median


def targets(figs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target with the figure it is judged on (median over runs) and met / not met."""
    out: list[dict[str, Any]] = []

    def add(name: str, target: str, value: float | None, met: bool | None, basis: str) -> None:
        out.append(
            {
                "target": name,
                "threshold": target,
                "value": None if value is None else round(value, 3),
                "met": met,
                "basis": basis,
            }
        )

    def at_most(name: str, threshold: str, value: float | None, limit: float, basis: str) -> None:
        """The target ``value <= limit``, added only where the figure exists (a scenario
        that did not run adds no row)."""
        if value is not None:
            add(name, threshold, value, value <= limit, basis)

    durable = [_median(figs, f"e2e.{p}.jobs_per_s") for p in DURABLE_PEERS]
    best_durable = max((v for v in durable if v), default=None)
    celery = _median(figs, "e2e.celery.jobs_per_s")
    lib = _median(figs, "e2e.ours-lib.jobs_per_s")
    if lib is not None and best_durable:
        add(
            "ours-lib: end-to-end ≥ 1.0x the best durable peer (Procrastinate/PgQueuer)",
            f"≥ {best_durable:.0f} jobs/s",
            lib,
            lib >= best_durable,
            "median jobs/s over runs",
        )
    http = _median(figs, "e2e.ours-http.jobs_per_s")
    if http is not None and celery:
        add(
            "ours-http: end-to-end ≥ 0.5x raw Celery",
            f"≥ {0.5 * celery:.0f} jobs/s",
            http,
            http >= 0.5 * celery,
            "median jobs/s over runs",
        )
    for ours in OURS:
        at_most(
            f"{ours}: CPU per job, whole machine",
            f"≤ {CPU_MS_PER_JOB_TARGET} ms",
            _median(figs, f"e2e.{ours}.machine_cpu_ms_per_job"),
            CPU_MS_PER_JOB_TARGET,
            "median over runs (other load on the machine counts too)",
        )
        at_most(
            f"{ours}: PostgreSQL commits per job",
            f"≤ {COMMITS_PER_JOB_TARGET:g}",
            _median(figs, f"e2e.{ours}.pg_commits_per_job"),
            COMMITS_PER_JOB_TARGET,
            "median over runs (all phases)",
        )
    for ours in OURS:
        for kind, limit, label in (
            ("pickup", PICKUP_P99_AT100_MS, "pickup"),
            ("e2e", E2E_P99_AT100_MS, "submit → succeeded"),
        ):
            at_most(
                f"{ours}: {label} p99 at 100 jobs/s",
                f"≤ {limit:.0f} ms",
                _median(figs, f"e2e.{ours}.at100.{kind}_p99_ms"),
                limit,
                "median of per-run p99",
            )
    at_most(
        "API accept p99 at 200 req/s",
        "≤ 50 ms",
        _median(figs, "api.at200.p99_ms"),
        50.0,
        "median of per-run p99",
    )
    at_most(
        "bulk: a delta of 1 % changed notes / the full export of the account (time)",
        "≤ 0.05x",
        _median(figs, "bulk.delta.ratio"),
        0.05,
        "submit + render, one run",
    )
    for name, fig in figs.items():
        if name.startswith("bulk.") and name.endswith(".peak_rss_mb"):
            fmt = name.split(".")[1]
            at_most(f"bulk {fmt}: peak worker RSS", "≤ 256 MB", fig["max"], 256.0, "max over runs")
    for case, op, label in (
        ("full", "submit", "scale: submit latency with the filled tables / empty"),
        ("full", "claim", "scale: claim latency with the filled tables / empty"),
        ("active", "submit", "scale: submit latency with 10,000 active (queued) jobs / empty"),
    ):
        empty = _median(figs, f"scale.empty.{op}_p50_ms")
        v = _median(figs, f"scale.{case}.{op}_p50_ms")
        if empty and v is not None:
            at_most(label, "≤ 1.25x", v / empty, 1.25, "ratio of median p50")
    for name, fig in figs.items():
        if name.startswith("webhooks.at") and name.endswith("commit_to_receiver_p99_ms"):
            v = fig["median"]
            add(
                f"webhooks: terminal commit → receiver p99 at {name.split('.')[1][2:]}/s",
                "≤ 1000 ms",
                v,
                v is not None and v <= 1000.0,
                "median of per-run p99",
            )
    at_most(
        "webhooks: backlog drained after the receiver returns",
        "≤ 30 s",
        _get(figs, "webhooks.backlog.drain_seconds", "max"),
        30.0,
        "worst run",
    )
    peak = _get(figs, "webhooks.backlog.max_concurrent", "max")
    bound = _get(figs, "webhooks.backlog.concurrency_bound", "max")
    if bound:
        at_most(
            "webhooks: requests in flight at the receiver within the per-endpoint bound",
            f"≤ {bound:.0f}",
            peak,
            bound,
            "worst run",
        )
    for name, fig in figs.items():
        if name.startswith("console.") and name.endswith(".p99_ms"):
            case = name.split(".")[1]
            at_most(
                f"console {case}: p99 over HTTP, signed in",
                "≤ 300 ms",
                fig["max"],
                300.0,
                "worst run",
            )
    scans = _get(figs, "console.seq_scans_of_big_tables", "max")
    if scans is not None:
        add(
            "console: statements that scan export_jobs / events / items / outbox",
            "= 0",
            scans,
            scans == 0,
            "EXPLAIN ANALYZE on the scale data, worst run",
        )
    victim = _get(figs, "fairness.backlog.victim_pickup_p99_s", "max")
    run = _get(figs, "fairness.bulk_run_p50_s", "max")
    if run is not None:
        at_most(
            "fairness: another tenant's bulk pickup p99 behind one tenant's backlog",
            f"≤ {run + 1.0:.2f} s (one bulk export's run time + 1 s)",
            victim,
            run + 1.0,
            "worst run",
        )
    worst = _get(figs, "recovery.seconds_to_all_succeeded", "max")
    b = _median(figs, "recovery.budget_seconds")
    if b:
        at_most(
            "recovery: N killed leases all succeeded"
            " (not an issue-10 target; docs/architecture.md service levels)",
            f"≤ {b:.1f} s (lease + scan x 1.2 + retry cap)",
            worst,
            b,
            "worst run",
        )
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return str(v)


def print_table(results: dict[str, Any]) -> None:
    console = Console(width=140)
    meta = results["meta"]
    console.print(
        f"[bold]notes-exports benchmark[/] runs={meta['runs']} quick={meta['quick']} "
        f"load before={meta['machine_before']['loadavg']} after={meta['machine_after']['loadavg']} "
        f"({meta['machine_before']['logical_cpus']} CPUs)"
    )
    figs = results["figures"]
    t = Table(title="Figures (min / median / max over runs)")
    for col in ("figure", "unit", "min", "median", "max", "n"):
        t.add_column(col, justify="left" if col == "figure" else "right")
    for name, f in figs.items():
        t.add_row(
            name,
            f["unit"],
            _fmt(f["min"]),
            _fmt(f["median"]),
            _fmt(f["max"]),
            str(len(f["values"])),
        )
    console.print(t)
    if results.get("ratios"):
        t = Table(title="Ours / peer (per run, then min / median / max)")
        for col in ("ratio", "min", "median", "max"):
            t.add_column(col, justify="left" if col == "ratio" else "right")
        for name, r in results["ratios"].items():
            t.add_row(name, _fmt(r["min"]), _fmt(r["median"]), _fmt(r["max"]))
        console.print(t)
    t = Table(title="Targets")
    for col in ("target", "threshold", "value", "result", "judged on"):
        t.add_column(col)
    for tg in results["targets"]:
        met = tg["met"]
        res = "[green]met[/]" if met else ("[red]not met[/]" if met is False else "—")
        t.add_row(tg["target"], tg["threshold"], _fmt(tg["value"]), res, tg["basis"])
    console.print(t)
    if results.get("e2e_table"):
        console.print("\n[bold]Equal footing, run 1[/] (Markdown, docs/performance.md)")
        console.print(results["e2e_table"], markup=False, highlight=False)
    if results.get("pg_per_export"):
        print_pg(console, results["pg_per_export"], top=12)
    errors = [
        (sysname, r.get("run"), r["error"])
        for sysname, runs in (_get(results, "scenarios", "e2e", "systems") or {}).items()
        for r in runs
        if r.get("error")
    ]
    for scen, body in results.get("scenarios", {}).items():
        for err in body.get("errors", []) if isinstance(body, dict) else []:
            errors.append((scen, None, err))
    for e in errors:
        console.print(f"[red]error[/] {e[0]} run {e[1]}: {e[2]}")
