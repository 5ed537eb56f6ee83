"""The ablation: the same benchmark on several versions of the code, interleaved round by
round on this machine, so that each change is judged against the baseline in one run.

``python -m bench.ablation [--base REV] [--variant NAME=REV_RANGE[+REV_RANGE...]]...
[--head NAME] [--rounds N] [--only e2e] [--systems ours-lib] [--env NAME:VAR=VALUE]...``

- ``base`` is a commit (default: the merge base of HEAD and ``main``): its tree as is.
- each ``--variant NAME=A..B[+C..D]`` is the base with the changes of those commit ranges
  applied (``git diff A B | git apply``, the product's code only: the docs, the tests and
  this harness stay the base's): one change alone against the baseline;
- ``--head NAME`` adds the working tree as it is (every change together); repeated, one
  copy per name, so that ``--env`` can turn one change off in each (head minus one);
- ``--env NAME:VAR=VALUE`` sets a product setting for one variant only (a toggle).

Each version is a plain copy of its tree under ``$BENCH_HOME/ablation/trees/<name>`` (``git
archive``, no git worktree) that imports its own code (``PYTHONPATH``) with this checkout's
virtual environment, and runs ``python -m bench run --runs 1`` with its own ``BENCH_HOME``
and its own ports (``BENCH_PG_PORT`` + i, ``BENCH_REDIS_PORT`` + i for the i-th version).
Round r runs every version, in an order rotated by one per round, so that drift of the
machine spreads over all of them. The result: per figure, the median over rounds of each
version and its ratio to the baseline's median, as a Markdown table (``--figures`` selects
them by substring) and as JSON in ``$BENCH_HOME/ablation/ablation-<time>.json``. Ratios
only mean something within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import BENCH_DIR
from devtools.stack import ROOT

DEFAULT_FIGURES = (
    ".jobs_per_s",
    "cpu_ms_per_job",
    "commits_per_job",
    "wal_bytes_per_job",
    "e2e_p50",
    "e2e_p99",
    "jobs_per_claim",
)


# What a variant takes from its commit ranges: the product's code, not its docs, tests or the
# benchmark harness, so that every version is measured by the base's one harness and a
# change whose docs moved on since the base still applies.
PRODUCT_PATHS = (".", ":!*.md", ":!bench", ":!tests")


@dataclass
class Version:
    """One version of the code under test."""

    name: str
    ranges: list[tuple[str, str]] = field(default_factory=list)
    head: bool = False
    env: dict[str, str] = field(default_factory=dict)


def _git(*args: str, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, **kw)


def _tree(base: str, version: Version, root: Path) -> Path:
    """A fresh copy of ``version``'s code under ``root``."""
    dest = root / version.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if version.head:
        files = _git("ls-files", "-co", "--exclude-standard", "-z").stdout.split(b"\0")
        for rel in (f.decode() for f in files if f):
            src = ROOT / rel
            if src.is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)
    else:
        archive = dest / ".tree.tar"
        archive.write_bytes(_git("archive", "--format=tar", base).stdout)
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
        archive.unlink()
        for a, b in version.ranges:
            patch = _git("diff", "--binary", a, b, "--", *PRODUCT_PATHS).stdout
            subprocess.run(
                ["git", "apply", "--whitespace=nowarn", "-"], cwd=dest, input=patch, check=True
            )
    venv = dest / ".venv"
    if not venv.exists():
        venv.symlink_to(ROOT / ".venv")
    return dest


def _env(
    tree: Path, home: Path, port: int, redis_port: int, extra: dict[str, str]
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(
                str(p) for p in (tree, tree / "libs/exportcore/src", tree / "libs/exportctl/src")
            ),
            "BENCH_HOME": str(home),
            "BENCH_PG_PORT": str(port),
            "BENCH_REDIS_PORT": str(redis_port),
            **extra,
        }
    )
    return env


def _figures(result: dict[str, Any]) -> dict[str, float]:
    out = {}
    for name, fig in (result.get("figures") or {}).items():
        value = fig.get("median") if isinstance(fig, dict) else None
        if isinstance(value, int | float):
            out[name] = float(value)
    return out


def run(args: argparse.Namespace) -> int:
    base = args.base or _git("merge-base", "HEAD", "main").stdout.decode().strip()
    versions = [Version("base")]
    for spec in args.variant:
        name, _, ranges = spec.partition("=")
        parsed = []
        for r in ranges.split("+"):
            a, _, b = r.partition("..")
            parsed.append((a, b or "HEAD"))
        versions.append(Version(name, parsed))
    for name in args.head:
        versions.append(Version(name, head=True))
    for spec in args.env:
        name, _, assignment = spec.partition(":")
        var, _, value = assignment.partition("=")
        next(v for v in versions if v.name == name).env[var] = value
    home = BENCH_DIR / "ablation"
    trees = {v.name: _tree(base, v, home / "trees") for v in versions}
    started = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    results: dict[str, list[dict[str, float]]] = {v.name: [] for v in versions}
    base_port = int(os.environ.get("BENCH_PG_PORT", "55451"))
    base_redis = int(os.environ.get("BENCH_REDIS_PORT", "56391"))
    for r in range(args.rounds):
        order = versions[r % len(versions) :] + versions[: r % len(versions)]
        for i, v in enumerate(order):
            idx = versions.index(v)
            vhome = home / "homes" / v.name
            cmd = [sys.executable, "-m", "bench", "run", "--runs", "1", "--only", args.only]
            if args.systems:
                cmd += ["--systems", args.systems]
            if args.quick:
                cmd.append("--quick")
            print(
                f"[ablation] round {r + 1}/{args.rounds}: {v.name} ({i + 1}/{len(order)})",
                flush=True,
            )
            proc = subprocess.run(
                cmd,
                cwd=trees[v.name],
                env=_env(trees[v.name], vhome, base_port + idx, base_redis + idx, v.env),
            )
            latest = vhome / "results" / "latest.json"
            if proc.returncode != 0 or not latest.exists():
                print(f"[ablation] {v.name} failed (exit {proc.returncode})", flush=True)
                continue
            kept = home / "runs" / started / f"{v.name}-{r}.json"
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(latest, kept)
            results[v.name].append(_figures(json.loads(latest.read_text())))
            latest.unlink()
    return report(results, args.figures or DEFAULT_FIGURES, home / f"ablation-{started}.json", base)


def report(
    results: dict[str, list[dict[str, float]]], wanted: tuple[str, ...], path: Path, base: str
) -> int:
    names = sorted(
        {k for runs in results.values() for r in runs for k in r if any(w in k for w in wanted)}
    )
    medians = {
        v: {k: statistics.median(vals) for k in names if (vals := [r[k] for r in runs if k in r])}
        for v, runs in results.items()
    }
    table = {"base": base, "rounds": {v: len(r) for v, r in results.items()}, "medians": medians}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=2))
    versions = list(results)
    print("| figure | " + " | ".join(versions) + " |")
    print("| --- |" + " --- |" * len(versions))
    for k in names:
        cells = []
        b = medians.get("base", {}).get(k)
        for v in versions:
            m = medians[v].get(k)
            if m is None:
                cells.append("—")
            elif v == "base" or not b:
                cells.append(f"{m:.4g}")
            else:
                cells.append(f"{m:.4g} ({m / b:.2f}x)")
        print(f"| `{k}` | " + " | ".join(cells) + " |")
    print(f"\nJSON: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ablation", description=__doc__)
    parser.add_argument(
        "--base", default="", help="the baseline commit (default: merge base with main)"
    )
    parser.add_argument("--variant", action="append", default=[], help="NAME=A..B[+C..D]")
    parser.add_argument(
        "--head",
        action="append",
        default=[],
        help="also measure the working tree, under this name (repeatable: one per --env toggle)",
    )
    parser.add_argument("--env", action="append", default=[], help="NAME:VAR=VALUE")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="e2e")
    parser.add_argument("--systems", default="ours-lib")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--figures", nargs="*", default=None, help="substrings of figure names")
    args = parser.parse_args(argv)
    if args.figures is not None:
        args.figures = tuple(args.figures)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
