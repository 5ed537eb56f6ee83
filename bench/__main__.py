"""``python -m bench [run|profile] [--quick] [--runs N] [--only SCENARIOS] [--systems ...]``.

``run`` measures every scenario (or ``--only`` some of
``e2e,costs,api,bulk,scale,console,bulk_replay,recovery,webhooks``; ``console`` runs on the
``scale`` data; ``bulk_replay`` is the console's bulk replay alone, baseline and ours),
prints a table and writes JSON under ``.bench/results/``. ``profile`` records py-spy
profiles of the api, the publisher, the recovery-scanner and a worker under steady load
into ``.bench/profiles/``.
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
    parser.add_argument("command", nargs="?", default="run", choices=("run", "profile"))
    parser.add_argument("--quick", action="store_true", help="small sizes (BENCH_QUICK=1)")
    parser.add_argument("--runs", type=int, default=None, help="repetitions (default 3, quick 1)")
    parser.add_argument(
        "--only", default="", help=f"comma-separated scenarios ({', '.join(SCENARIOS)})"
    )
    parser.add_argument("--systems", default="", help="comma-separated e2e systems")
    parser.add_argument("--keep-servers", action="store_true", help="leave PostgreSQL/Redis up")
    args = parser.parse_args(argv)

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


if __name__ == "__main__":
    sys.exit(main())
