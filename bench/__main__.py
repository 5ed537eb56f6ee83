"""``python -m bench [run|profile|pgstats] [--quick] [--runs N] [--only …] [--systems …]``.

``run`` measures every scenario (or ``--only`` some of
``e2e,costs,api,bulk,scale,console,bulk_replay,recovery,webhooks``; ``console`` runs on the
``scale`` data; ``bulk_replay`` is the console's bulk replay alone, baseline and ours),
prints a table and writes JSON under ``.bench/results/``. ``profile`` records py-spy
profiles of the api, the publisher, the recovery-scanner and a worker under steady load
into ``.bench/profiles/``. ``pgstats`` prints, from a results file (default
``.bench/results/latest.json``), what PostgreSQL did per export in the e2e phases ``sat``
and ``at50`` of each system: every statement and every table (``--phase``, ``--top``).
"""

from __future__ import annotations

import argparse
import sys

SCENARIOS = (
    "e2e",
    "costs",
    "api",
    "bulk",
    "scale",
    "console",
    "bulk_replay",
    "recovery",
    "webhooks",
    "fairness",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("command", nargs="?", default="run", choices=("run", "profile", "pgstats"))
    parser.add_argument("--quick", action="store_true", help="small sizes (BENCH_QUICK=1)")
    parser.add_argument("--runs", type=int, default=None, help="repetitions (default 3, quick 1)")
    parser.add_argument(
        "--only", default="", help=f"comma-separated scenarios ({', '.join(SCENARIOS)})"
    )
    parser.add_argument("--systems", default="", help="comma-separated e2e systems")
    parser.add_argument("--keep-servers", action="store_true", help="leave PostgreSQL/Redis up")
    parser.add_argument("--results", default="", help="pgstats: a results JSON (latest.json)")
    parser.add_argument("--phase", default="", help="pgstats: sat or at50 (default both)")
    parser.add_argument("--top", type=int, default=0, help="pgstats: statements shown (0: all)")
    args = parser.parse_args(argv)
    if args.command == "pgstats":
        return _pgstats(args.results, args.systems, args.phase, args.top)

    from bench.common import Config
    from bench.runner import profile, run

    cfg = Config.from_env(quick=True if args.quick else None, runs=args.runs)
    if args.systems:
        cfg.systems = tuple(s for s in args.systems.split(",") if s)
    if args.command == "profile":
        return profile(cfg, keep_servers=args.keep_servers)
    only = tuple(s for s in args.only.split(",") if s) or SCENARIOS
    unknown = set(only) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    return run(cfg, only, keep_servers=args.keep_servers)


def _pgstats(path: str, systems: str, phase: str, top: int) -> int:
    """Print the per-export PostgreSQL tables of a results file; 2 when it has none."""
    import json
    from pathlib import Path

    from rich.console import Console

    from bench import report
    from bench.common import BENCH_DIR

    file = Path(path) if path else BENCH_DIR / "results" / "latest.json"
    try:
        results = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        print(f"cannot read {file}: {exc}; run `make bench ONLY=e2e` first", file=sys.stderr)
        return 2
    per_export = results.get("pg_per_export") or report.pg_per_export(results)
    if not per_export:
        print(f"{file} has no per-export PostgreSQL figures (an e2e run records them)")
        return 2
    if phase and phase not in report.PG_PHASES:
        print(f"--phase: one of {', '.join(report.PG_PHASES)}", file=sys.stderr)
        return 2
    report.print_pg(
        Console(width=200),
        per_export,
        systems=tuple(s for s in systems.split(",") if s),
        phases=(phase,) if phase else report.PG_PHASES,
        top=top or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
