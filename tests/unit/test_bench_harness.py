"""The benchmark harness's own logic (no servers): statistics, targets, ratios, the load
generator and wrk's output. Speed is never asserted anywhere; the harness reports it."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import loadgen, report
from bench.common import latency_summary, percentile, spread

WRK_OUTPUT = """Running 4s test @ http://127.0.0.1:8000/v1/exports
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    21.30ms   10.12ms 120.00ms   80.00%
    Req/Sec   380.00     40.00   450.00     70.00%
  Latency Distribution
     50%   19.50ms
     75%   25.00ms
     90%   31.00ms
     99%    1.20s
  1520 requests in 4.00s, 700.00KB read
  Non-2xx or 3xx responses: 3
Requests/sec:    380.00
Transfer/sec:    175.00KB
"""


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_latency_summary_in_milliseconds() -> None:
    s = latency_summary([0.001, 0.002, 0.003])
    assert s["n"] == 3 and s["p50_ms"] == 2.0 and s["max_ms"] == 3.0


def test_spread_drops_missing_runs() -> None:
    s = spread([3.0, None, 1.0, 2.0])
    assert (s["min"], s["median"], s["max"]) == (1.0, 2.0, 3.0)
    assert spread([None])["median"] is None


def test_wrk_output_is_parsed() -> None:
    r = loadgen.parse_wrk(WRK_OUTPUT)
    assert r["rate"] == 380.0
    assert r["p50_ms"] == 19.5 and r["p99_ms"] == 1200.0
    assert r["non_2xx"] == 3 and r["socket_errors"] == 0 and r["requests"] == 1520


def _fig(*values: float) -> dict:
    return {"unit": "", **spread(list(values))}


def test_targets_and_ratios_are_judged_run_by_run() -> None:
    figs = {
        "e2e.ours-lib.jobs_per_s": _fig(300, 320, 310),
        "e2e.celery.jobs_per_s": _fig(600, 640, 620),
        "e2e.procrastinate.jobs_per_s": _fig(350, 340, 360),
        "e2e.pgqueuer-psycopg.jobs_per_s": _fig(280, 290, 300),
        "e2e.ours-http.jobs_per_s": _fig(300, 330, 310),
        "e2e.ours-lib.at100.pickup_p99_ms": _fig(8, 9, 60),
        "e2e.ours-lib.at100.e2e_p99_ms": _fig(30, 28, 20),
        "e2e.ours-lib.machine_cpu_ms_per_job": _fig(2.9, 3.2, 3.1),
        "e2e.ours-lib.pg_commits_per_job": _fig(2.5, 2.9, 3.0),
        "api.at200.p99_ms": _fig(40, 45, 49),
        "bulk.json.peak_rss_mb": _fig(100, 300),
        "scale.empty.submit_p50_ms": _fig(2.0),
        "scale.full.submit_p50_ms": _fig(2.4),
        "scale.empty.claim_p50_ms": _fig(1.0),
        "scale.full.claim_p50_ms": _fig(1.3),
        "scale.active.submit_p50_ms": _fig(2.6),
        "recovery.seconds_to_all_succeeded": _fig(30, 47, 31),
        "recovery.budget_seconds": _fig(46, 46, 46),
    }
    targets = {t["target"].split(" (")[0]: t for t in report.targets(figs)}
    met = {name: t["met"] for name, t in targets.items()}
    assert met["ours-lib: end-to-end ≥ 1.0x the best durable peer"] is False  # 310 < 350
    assert met["ours-http: end-to-end ≥ 0.5x raw Celery"] is True  # 310 ≥ 310
    assert met["ours-lib: pickup p99 at 100 jobs/s"] is True  # median of p99s: 9
    assert met["ours-lib: submit → succeeded p99 at 100 jobs/s"] is False  # 28 > 25
    assert met["ours-lib: CPU per job, whole machine"] is False  # median 3.1 > 3.0
    assert met["ours-lib: PostgreSQL commits per job"] is True  # median 2.9
    assert met["scale: submit latency with 10,000 active"] is False  # 1.3x
    assert met["API accept p99 at 200 req/s"] is True
    assert met["bulk json: peak worker RSS"] is False  # judged on the worst run
    assert met["scale: submit latency with the filled tables / empty"] is True  # 1.2x
    assert met["scale: claim latency with the filled tables / empty"] is False  # 1.3x
    recovery = targets["recovery: N killed leases all succeeded"]
    assert (recovery["met"], recovery["value"]) == (False, 47)  # the worst run, shown and judged
    ratios = report.ratios(figs)
    assert ratios["ours-lib/celery.jobs_per_s"]["median"] == 0.5


def test_console_pages_are_judged_on_their_worst_run() -> None:
    results = {
        "scenarios": {
            "console": {
                "runs": [
                    {"pages": {"jobs": {"p50_ms": 40, "p99_ms": 120}}, "seq_scans": {}},
                    {
                        "pages": {"jobs": {"p50_ms": 45, "p99_ms": 310}},
                        "seq_scans": {"jobs": ["export_jobs"]},
                    },
                ]
            }
        }
    }
    figs = report.figures(results)
    assert figs["console.jobs.p99_ms"]["values"] == [120, 310]
    targets = {t["target"]: t for t in report.targets(figs)}
    page = targets["console jobs: p99 over HTTP, signed in"]
    assert (page["met"], page["value"]) == (False, 310)
    scans = next(t for name, t in targets.items() if name.startswith("console: statements"))
    assert (scans["met"], scans["value"]) == (False, 1)


class _Accept(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"status": "queued"}'
        self.send_response(202)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_load_generators_against_a_local_server() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Accept)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/exports"
        res = loadgen.open_loop(url, {"note_ids": [1]}, {"Authorization": "Bearer x"}, 200, 0.5)
        assert res.sent == 100 and res.statuses == {202: 100} and len(res.latencies) == 100
        assert res.send_elapsed >= 0.49  # the schedule was kept, not compressed
        res = loadgen.closed_loop(url, {"note_ids": [1]}, {}, 4, 50)
        assert res.ok == 50 and res.errors == 0
    finally:
        server.shutdown()


def test_every_scenario_module_imports() -> None:
    """The runner imports a scenario only when it is asked for, so a broken import (a
    helper that moved) would surface only in the middle of a ``make bench`` run, after the
    scenarios before it had run for minutes and their results were lost. The peers'
    adapters are left out: their libraries come with ``make bench-install`` only."""
    import importlib
    import pkgutil

    import bench

    names = [m.name for m in pkgutil.iter_modules(bench.__path__) if m.name != "peers"]
    assert {"e2e", "fairness", "recovery", "webhooks"} <= set(names)
    for name in names:
        importlib.import_module(f"bench.{name}")


def test_every_benchmarked_system_implements_the_whole_interface() -> None:
    """``bench.e2e.System`` is abstract: every system the e2e scenario measures (ours, the
    peers) implements each of its methods, and one that lacks a method fails when it is
    built rather than answering None in the middle of a run."""
    from bench import e2e

    def subclasses(cls: type) -> list[type]:
        return [s for sub in cls.__subclasses__() for s in (sub, *subclasses(sub))]

    systems = subclasses(e2e.System)
    assert {e2e.Ours, e2e.CeleryPeer, e2e.ProcrastinatePeer, e2e.PgqPeer} <= set(systems)
    for cls in systems:
        assert not cls.__abstractmethods__, (cls.__name__, sorted(cls.__abstractmethods__))

    class Incomplete(e2e.System):
        def start(self) -> None:
            pass

    with pytest.raises(TypeError, match="abstract"):
        Incomplete(None, None, None)  # type: ignore[abstract, arg-type]


# --- the equal-footing rules (bench/footing.py, bench/report.py) ------------------------------


def test_saturation_is_jobs_over_first_submit_to_last_success() -> None:
    from bench import footing

    submitted = {"a": 100.0, "b": 100.5, "c": 101.0}
    finished = {"a": 100.2, "b": 101.5, "c": 102.0}
    assert footing.saturation_rate(submitted, finished) == 3 / 2.0
    # a burst that lost a job measures no saturation
    assert footing.saturation_rate(submitted, {"a": 100.2, "b": 101.5}) is None
    assert footing.saturation_rate({}, {}) is None


def test_fraction_rates_are_of_the_systems_own_saturation() -> None:
    from bench import footing

    assert footing.fraction_rates(300.0) == {"at50": 150.0, "at80": 240.0}
    assert footing.fraction_rates(10.0, {"half": 0.5}) == {"half": 5.0}
    with pytest.raises(ValueError, match="saturation"):
        footing.fraction_rates(0.0)
    with pytest.raises(ValueError, match="fraction"):
        footing.fraction_rates(100.0, {"over": 1.5})


def test_client_latency_runs_from_the_producers_submit_to_the_recorded_success() -> None:
    from bench import footing

    lat, missing = footing.client_latencies({"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.01, "c": 3.5})
    assert sorted(round(v, 6) for v in lat) == [0.01, 0.5] and missing == 1


def test_kept_up_means_no_backlog_grew_over_the_phase() -> None:
    from bench import footing

    submitted = {str(i): i * 0.1 for i in range(100)}  # 10/s for ~10 s
    assert footing.kept_up(submitted, {k: t + 0.05 for k, t in submitted.items()})
    # completions at half the arrival rate: the backlog grows, the last job ends at ~20 s
    assert not footing.kept_up(submitted, {k: t * 2 + 0.05 for k, t in submitted.items()})
    assert not footing.kept_up(submitted, {"0": 0.1})  # jobs missing


def test_max_overlap_counts_concurrent_executions() -> None:
    from bench import footing

    assert footing.max_overlap([]) == 0
    assert footing.max_overlap([(0, 1), (1, 2), (2, 3)]) == 1  # back to back: never two
    assert footing.max_overlap([(0, 10), (1, 2), (1.5, 3), (5, 6)]) == 3
    # six threads of one process running at once (what PgQueuer's default pool allowed)
    assert footing.max_overlap([(0.01 * i, 1.0) for i in range(6)]) == 6


def test_cpu_accounting_by_process_tree() -> None:
    from bench.footing import ProcSample as P
    from bench.footing import cpu_delta

    before = {
        "worker": {10: P(started=1.0, cpu=5.0), 11: P(started=1.0, cpu=2.0)},
        "postgres backends": {20: P(started=2.0, cpu=1.0), 21: P(started=2.0, cpu=0.5)},
    }
    after = {
        # 10 used 1.5 s; 11 exited (its last interval is lost); 12 was born and used 0.25 s
        "worker": {10: P(started=1.0, cpu=6.5), 12: P(started=9.0, cpu=0.25)},
        # 20 used 0.5 s; pid 21 was reused by a new backend that used 0.1 s since its birth
        "postgres backends": {20: P(started=2.0, cpu=1.5), 21: P(started=9.5, cpu=0.1)},
    }
    d = cpu_delta(before, after)
    assert d.seconds == {"worker": 1.75, "postgres backends": 0.6}
    assert round(d.total, 6) == 2.35
    assert (d.born, d.vanished) == (2, 2)
    # a counter never runs backwards into a negative share
    assert cpu_delta({"g": {1: P(1.0, 3.0)}}, {"g": {1: P(1.0, 2.0)}}).seconds == {"g": 0.0}


def _e2e_run(jobs_per_s: float, cpu50: float, p99_50: float, p99_noisy: float, **kw: float) -> dict:
    return {
        "jobs_per_s": jobs_per_s,
        "concurrency": 2,
        "sat": {
            "write_commits_per_job": kw.get("commits", 2.0),
            "wal_bytes_per_job": kw.get("wal", 3000.0),
        },
        "at50": {"cpu_ms_per_job": cpu50, "e2e": {"p50_ms": p99_50 / 2, "p99_ms": p99_50}},
        "noisy": {"e2e": {"p50_ms": p99_noisy / 2, "p99_ms": p99_noisy}},
        "at80": {"e2e": {"p50_ms": 2 * p99_50, "p99_ms": 4 * p99_50}},
        "idle": {"e2e": {"p50_ms": kw.get("idle_p50", 10.0), "p99_ms": 20.0}},
    }


def test_footing_ratios_take_the_best_durable_peer_of_each_run_and_figure() -> None:
    results = {
        "scenarios": {
            "e2e": {
                "systems": {
                    "ours-lib": [
                        _e2e_run(300, 4.0, 12.0, 20.0, commits=2.4, wal=9000.0, idle_p50=31.0)
                    ],
                    "celery": [_e2e_run(450, 3.0, 6.0, 9.0, commits=0.0, wal=0.0)],
                    "procrastinate": [_e2e_run(200, 8.0, 8.0, 40.0)],
                    "pgqueuer-psycopg": [_e2e_run(500, 3.5, 16.0, 24.0, wal=2500.0)],
                    "pgqueuer-asyncpg": [_e2e_run(520, 3.8, 9.0, 12.0, wal=2600.0)],
                }
            }
        }
    }
    r = report.footing_ratios(results)
    # more jobs/s is better: PgQueuer asyncpg's 520 is the reference
    assert r["ours-lib/best-durable.jobs_per_s"]["median"] == round(300 / 520, 4)
    # less CPU is better: PgQueuer psycopg's 3.5
    assert r["ours-lib/best-durable.cpu_ms_per_job_at50"]["median"] == round(4.0 / 3.5, 4)
    assert r["ours-lib/celery.e2e_p99_ms_at50"]["median"] == 2.0
    # a zero reference (raw Celery writes nothing to PostgreSQL) gives no ratio
    assert "ours-lib/celery.wal_bytes_per_job" not in r
    # the noisy-neighbour ratio is a cost too: PgQueuer asyncpg's 12/9 is the best
    assert r["ours-lib/best-durable.e2e_p99_noisy_ratio"]["median"] == round(
        (20 / 12) / (12 / 9), 4
    )
    results["figures"] = report.figures(results)
    figs = results["figures"]
    assert figs["e2e.ours-lib.e2e_p99_noisy_ratio"]["median"] == round(20 / 12, 4)
    assert figs["e2e.ours-lib.cpu_ms_per_job_at50"]["median"] == 4.0
    assert figs["e2e.ours-lib.write_commits_per_job"]["median"] == 2.4
    assert figs["e2e.ours-lib.e2e_p99_ms_at80"]["median"] == 48.0
    assert figs["e2e.celery.concurrency"]["median"] == 2
    met = {t["target"]: t["met"] for t in report.footing_targets(results)}
    assert met["ours-lib: jobs/s at saturation / best durable peer"] is False
    assert met["ours-lib: write transactions per job at saturation"] is True  # 2.4 <= 2.5
    assert met["ours-lib: WAL bytes per job / PgQueuer psycopg"] is False  # 3.6x
    # noisy/quiet 1.67 is under 2x but worse than PgQueuer asyncpg's 1.33
    assert met["ours-lib: e2e p99 with a noisy neighbour / quiet"] is False
    # one export on an idle system: 31 ms is over the 30 ms target
    assert figs["e2e.ours-lib.e2e_p50_ms_idle"]["median"] == 31.0
    assert met["ours-lib: an idle fast-lane export, submit → succeeded p50 (ms)"] is False
    table = report.e2e_table(results)
    assert "| ours-lib / best durable peer |" in table and "| pgqueuer-asyncpg | 2 | 520" in table


def test_a_retry_after_a_closed_keepalive_takes_a_new_connection() -> None:
    """The server closed every idle kept-alive connection (gunicorn's keepalive at a low
    rate): the request is sent again on a new connection, not on another stale one."""
    import asyncio

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Accept)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]

    async def go() -> loadgen.LoadResult:
        host, p, request = loadgen.build_request(
            f"http://127.0.0.1:{port}/v1/exports", {"note_ids": [1]}, {}
        )
        pool = loadgen._Pool(host, p, 8)
        res = loadgen.LoadResult()
        conns = [await pool.get() for _ in range(3)]
        for c in conns:  # used once, then closed by "the server" while idle
            c.used = True
            c.writer.close()
            await pool.put(c)
        await loadgen._one(pool, request, res, 0.0, 0.0)
        pool.close()
        return res

    try:
        res = asyncio.run(go())
        assert res.statuses == {202: 1} and res.errors == 0 and res.reconnects == 1
    finally:
        server.shutdown()
