"""Command line: ``python -m devtools.drills [run] [--only NAME ...] [--ci] [--s3] [--pooler]
[--out DIR]``,
``python -m devtools.drills list`` and ``python -m devtools.drills soak --duration S --rate R``.

Exit status 0 only when every selected drill (or the soak) passed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from devtools.drills.config import CI_SETTINGS, DrillSettings
from devtools.drills.harness import DRILLS_HOME


def _run(args: argparse.Namespace) -> int:
    from devtools.drills.registry import run_drills, select
    from devtools.drills.report import drills_table, print_table

    drills = select(args.only, ci=args.ci, s3=args.s3)
    if not drills:  # e.g. `make drills DRILLS=x`'s S3 pass for a drill not marked s3
        print("no drill to run" + (" on S3" if args.s3 else ""))
        return 0
    settings = CI_SETTINGS if args.ci else DrillSettings()
    out = Path(args.out or DRILLS_HOME / "evidence" / time.strftime("%Y%m%d-%H%M%S"))
    say = lambda m: print(m, flush=True)  # noqa: E731
    if args.s3:
        from devtools.drills.harness import DrillEnvironment
        from devtools.s3 import MotoServer

        moto = MotoServer(log_path=DRILLS_HOME / f"moto-{time.strftime('%Y%m%d-%H%M%S')}.log")
        moto.start()
        try:
            with DrillEnvironment(settings, s3=moto, say=say, pooler=args.pooler) as env:
                results = run_drills(drills, out, settings, say=say, env=env)
        finally:
            moto.stop()
    else:
        results = run_drills(drills, out, settings, say=say, pooler=args.pooler)
    print_table(drills_table(results))
    print(f"evidence: {out}/<drill>.json, summary: {out}/summary.json")
    failed = [ev.name for ev in results if ev.verdict == "failed"]
    skipped = [ev.name for ev in results if ev.verdict == "skipped"]
    if skipped:
        print(f"skipped (not passed): {', '.join(skipped)}")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    return 1 if failed or (skipped and args.strict) else 0


def _list(_: argparse.Namespace) -> int:
    from devtools.drills.registry import select

    for d in select():
        flag = (
            ("ci" if d.ci else "  ")
            + (" s3" if d.s3 else "   ")
            + (" ha" if d.topology == "ha" else "   ")
        )
        print(f"{flag} {d.group:8} {d.name:40} {d.title}")
    return 0


def _soak(args: argparse.Namespace) -> int:
    from devtools.drills.soak import SoakOptions, run_soak

    out = Path(args.out or DRILLS_HOME / "soak" / time.strftime("%Y%m%d-%H%M%S"))
    options = SoakOptions(
        duration=args.duration,
        rate=args.rate,
        chaos_min=args.chaos_min,
        chaos_max=args.chaos_max,
        seed=args.seed,
        components=tuple(args.components.split(",")) if args.components else None,
        failovers=args.failovers,
        failover_every=args.failover_every,
    )
    result = run_soak(options, out, say=lambda m: print(m, flush=True))
    return 0 if result.passed else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m devtools.drills``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        argv.insert(0, "run")
    parser = argparse.ArgumentParser(prog="python -m devtools.drills", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run drills (all by default)")
    run.add_argument("--only", nargs="+", metavar="NAME", help="these drills, in this order")
    run.add_argument("--ci", action="store_true", help="the CI subset with the CI settings")
    run.add_argument(
        "--s3",
        action="store_true",
        help="artifacts on a local S3-compatible server (moto): the drills marked s3 only",
    )
    run.add_argument(
        "--pooler",
        action="store_true",
        help="the processes reach PostgreSQL through PgBouncer in transaction mode",
    )
    run.add_argument("--out", help="evidence folder (default .drills/evidence/<time>)")
    run.add_argument("--strict", action="store_true", help="a skipped drill fails the run")
    run.set_defaults(func=_run)
    lister = sub.add_parser("list", help="list the drills")
    lister.set_defaults(func=_list)
    soak = sub.add_parser("soak", help="chaos soak: load + random kills and stalls")
    soak.add_argument("--duration", type=float, default=120.0, help="seconds of chaos")
    soak.add_argument("--rate", type=float, default=3.0, help="submits per second")
    soak.add_argument("--chaos-min", type=float, default=2.0, help="least seconds between faults")
    soak.add_argument("--chaos-max", type=float, default=5.0, help="most seconds between faults")
    soak.add_argument("--seed", type=int, default=None, help="random seed (printed)")
    soak.add_argument("--components", help="comma list of targets (default: all)")
    soak.add_argument(
        "--failovers",
        action="store_true",
        help="on Patroni + Sentinel: a switchover or a primary kill every --failover-every s",
    )
    soak.add_argument("--failover-every", type=float, default=60.0, help="seconds")
    soak.add_argument("--out", help="report folder (default .drills/soak/<time>)")
    soak.set_defaults(func=_soak)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
