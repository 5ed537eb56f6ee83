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
