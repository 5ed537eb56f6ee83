"""Measure the workers' downstream rate limit on real parts (a probe, not a test: it reports
numbers and asserts nothing): P worker-like processes write small artifacts to a real
S3-compatible server (moto) as fast as they can, each through its own
:class:`~exportcore.artifacts.s3.S3ArtifactStore` and
:class:`~exportcore.downstream.DownstreamLimiter` on one real Redis (what P worker replicas
share), for ``--seconds`` per configuration:

- ``unlimited``: ``DOWNSTREAM_STORAGE_RATE=0`` — the burst the store sees without a limit;
- ``no-wait``: a limit so high that no call ever waits — what taking a token costs a call;
- ``limited``: ``DOWNSTREAM_STORAGE_RATE=--rate`` — the rate the store sees under the limit.

    python -m devtools.downstream_burst --processes 4 --seconds 5 --rate 50

It starts its own Redis under ``.downstream/`` (``--redis-port``) and a moto server on a free
port, and prints one JSON object: calls per second seen by the store and the mean call time
of each configuration, and the ratios (limited / what the bucket allows in the run — its
burst, then the rate —, limited / unlimited, no-wait / unlimited call time), and the mean
time of one token taken with no wait (``acquire_ms``) against one call.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

from devtools.s3 import MotoServer
from devtools.stack import ROOT, Servers, free_port


def _writer(env: dict[str, Any], seconds: float, start: Any, out: Any) -> None:
    from exportcore.artifacts import S3ArtifactStore, S3Config, artifact_key
    from exportcore.downstream import DownstreamLimiter
    from exportcore.settings import Settings

    settings = Settings(**env)
    downstream = DownstreamLimiter(settings)
    store = S3ArtifactStore(
        S3Config.from_settings(settings, settings.artifact_location()), downstream
    )
    store.client()  # created before the clock starts, as a worker's is
    body = b"x" * 1024
    calls, busy = 0, 0.0
    start.wait()  # every process starts its burst at once, after its setup
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        with store.open_writer(artifact_key("bench", uuid4(), uuid4(), "json")) as w:
            w.write(body)
            w.commit()
        busy += time.monotonic() - t0
        calls += 1
    downstream.close()
    out.put((calls, busy))


def _run(base_env: dict[str, Any], processes: int, seconds: float, rate: float) -> dict[str, float]:
    env = {
        **base_env,
        "downstream_storage_rate": rate,
        "downstream_storage_burst": max(1, int(rate)),
    }
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = ctx.Barrier(processes)
    procs = [ctx.Process(target=_writer, args=(env, seconds, start, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    calls = sum(c for c, _ in results)
    busy = sum(b for _, b in results)
    return {
        "calls_per_second": round(calls / seconds, 1),
        "mean_call_ms": round(busy / calls * 1000, 2),
    }


def _acquire_ms(env: dict[str, Any], n: int = 500) -> float:
    """Mean milliseconds of one token taken (one round trip to Redis) when none waits."""
    from exportcore.downstream import STORAGE, DownstreamLimiter
    from exportcore.settings import Settings

    limiter = DownstreamLimiter(
        Settings(**{**env, "downstream_storage_rate": 1e9, "downstream_storage_burst": 10**9})
    )
    limiter.acquire(STORAGE)
    t0 = time.perf_counter()
    for _ in range(n):
        limiter.acquire(STORAGE)
    elapsed = time.perf_counter() - t0
    limiter.close()
    return round(elapsed / n * 1000, 3)


def main(argv: list[str] | None = None) -> int:
    """Run the three configurations and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=50.0, help="the limited run's rate")
    parser.add_argument("--redis-port", type=int, default=free_port())
    args = parser.parse_args(argv)
    base = ROOT / ".downstream"
    servers = Servers(base, pg_port=0, redis_port=args.redis_port)
    servers.start_redis()
    moto = MotoServer(log_path=Path(base) / "moto.log").start()
    try:
        bucket = moto.create_bucket(f"burst-{uuid4().hex[:8]}")
        env: dict[str, Any] = {
            "celery_broker_url": servers.redis_url(0),
            **{k.lower(): v for k, v in moto.env(bucket, "artifacts").items()},
        }
        report: dict[str, Any] = {"processes": args.processes, "seconds": args.seconds}
        report["unlimited"] = _run(env, args.processes, args.seconds, 0.0)
        report["no-wait"] = _run(env, args.processes, args.seconds, 1e9)
        report["limited"] = _run(env, args.processes, args.seconds, args.rate)
        report["rate"] = args.rate
        # the most the bucket allows in the run: its burst, then the rate
        allowed = (max(1, int(args.rate)) + args.rate * args.seconds) / args.seconds
        report["limited_over_allowed"] = round(report["limited"]["calls_per_second"] / allowed, 3)
        report["limited_over_unlimited"] = round(
            report["limited"]["calls_per_second"] / report["unlimited"]["calls_per_second"], 3
        )
        report["token_cost_ratio"] = round(
            report["no-wait"]["mean_call_ms"] / report["unlimited"]["mean_call_ms"], 3
        )
        report["acquire_ms"] = _acquire_ms(env)
        report["acquire_over_call"] = round(
            report["acquire_ms"] / report["unlimited"]["mean_call_ms"], 4
        )
        print(json.dumps(report))
    finally:
        moto.stop()
        servers.stop_redis()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
