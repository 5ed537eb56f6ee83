"""The per-export PostgreSQL table of the benchmark (bench/pgstats.py, bench/report.py): how
pg_stat_statements' texts are matched to our named statements and to the functions that ran
them, and the per-export arithmetic. No server: the texts below are what PostgreSQL 15 kept
for the statements (read from a server with ``pg_stat_statements.track = all``); the reading
itself runs in ``make bench-smoke`` (tests/benchmarks/test_bench_smoke.py)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import pgstats, report
from exportcore.sql import q

# A statement as psycopg sends it, and the text pg_stat_statements kept for it: the
# parameters numbered, every constant (negative ones whole, booleans, NULL) a parameter too.
SENT = """-- a comment with it's apostrophe
SELECT f(%(x)s) AS r, %(x)s::int + 1, 'succeeded'::text, true, NULL::int /* block */
WHERE %(y)s > -3 LIMIT 1"""
KEPT = (
    "-- a comment with it's apostrophe\nSELECT f($1) AS r, $1::int + $3, $4::text, $5, "
    "$6::int /* block */ WHERE $2 > $7 LIMIT $8"
)

FUNCTION = """
DECLARE n int;
BEGIN
  -- the count's comment
  SELECT count(*) INTO n FROM t WHERE id > 5 AND s = 'it''s';
  INSERT INTO t VALUES (x, 'a', true);
  PERFORM pg_sleep(0);
  RETURN n;
END"""


def test_a_sent_statement_and_its_kept_text_normalize_alike() -> None:
    assert pgstats.normalize(SENT) == pgstats.normalize(KEPT)
    assert pgstats.normalize(SENT) == (
        "select f ( ? ) as r , ? :: int + ? , ? :: text , ? , ? :: int where ? > ? limit ?"
    )
    # strings, quoted identifiers, dollar quotes, nested comments, %% and exponents
    assert pgstats.tokens("""SELECT "A b", $q$x'y$q$, 1.5e3 /* a /* b */ c */ FROM t -- x""") == [
        "select",
        '"A b"',
        ",",
        "?",
        ",",
        "?",
        "from",
        "t",
    ]
    assert pgstats.tokens("SELECT 'a''b' LIKE 'x%%'") == ["select", "?", "like", "?"]
    assert pgstats.tokens("x %% 2") == ["x", "%", "?"]
    assert pgstats.tokens("a||b->>'k' <= -1") == ["a", "||", "b", "->>", "?", "<=", "?"]


def catalog() -> pgstats.Catalog:
    return pgstats.Catalog.build(
        {
            "jobs.mine": SENT,
            "jobs.age": "SELECT extract(epoch FROM now() - created_at) FROM export_jobs",
            "outbox.lock": "SELECT pg_try_advisory_xact_lock(1)",
            "webhooks.lock": "SELECT pg_try_advisory_xact_lock(2)",
        },
        [
            ("f", False, FUNCTION),
            ("history", True, "BEGIN INSERT INTO h VALUES (NEW.id, 'a'); END"),
            ("history2", True, "BEGIN INSERT INTO h VALUES (NEW.id, 'b'); END"),
        ],
    )


def test_statements_are_named_by_their_text() -> None:
    cat = catalog()
    assert cat.label(KEPT, toplevel=True) == ("jobs.mine", True)
    # a keyword PostgreSQL turned into a constant
    assert cat.label(
        "SELECT extract($1 FROM now() - created_at) FROM export_jobs", toplevel=True
    ) == ("jobs.age", True)
    # two statements that differ only in constants are one entry: both names
    assert cat.label("SELECT pg_try_advisory_xact_lock($1)", True) == (
        "outbox.lock | webhooks.lock",
        True,
    )
    # a foreign key's check names its table
    ri = (
        'SELECT 1 FROM ONLY "public"."tenants" x WHERE "id" OPERATOR(pg_catalog.=) $1'
        " FOR KEY SHARE OF x"
    )
    assert cat.label(ri, False) == ("foreign key check: tenants", True)
    # anything else: its text, cut after 60 characters
    long = "SELECT " + ", ".join(f"column_{i}" for i in range(20)) + " FROM t"
    assert cat.label(long, True) == (
        "select column_0, column_1, column_2, column_3, column_4, column_5 …",
        False,
    )
    assert cat.label("SELECT set_config($1, $2, $3)", True) == ("select set_config(?, ?, ?)", False)
    assert cat.label("COMMIT", True) == ("commit", False)


def test_nested_statements_are_named_by_the_function_that_ran_them() -> None:
    cat = catalog()
    # PL/pgSQL sends SELECT … INTO without its INTO, and PERFORM as SELECT
    assert cat.label("SELECT count(*)        FROM t WHERE id > $1 AND s = $2", False) == (
        "f(): select count(*) from t where id > ? and s = ?",
        True,
    )
    assert cat.label("INSERT INTO t VALUES (x, $2, $3)", False)[0].startswith("f(): insert")
    assert cat.label("SELECT pg_sleep($1)", False) == ("f(): select pg_sleep(?)", True)
    # one text in two functions (constants apart) is one entry of pg_stat_statements
    assert cat.label("INSERT INTO h VALUES (NEW.id, $1)", False) == (
        "trigger history() | trigger history2(): insert into h values (new.id, ?)",
        True,
    )
    assert cat.label("SELECT $1::text[]", False) == ("select ?::text[]", False)
    # a top-level statement is never a function's, and an unknown one keeps its text
    assert cat.label("INSERT INTO t VALUES (x, $2, $3)", True)[1] is False
    assert cat.label("DELETE FROM elsewhere", False) == ("delete from elsewhere", False)


def test_every_named_statement_of_the_product_is_in_the_catalog() -> None:
    named = pgstats.named_statements()
    assert named["jobs.job_submit"] == q("jobs", "job_submit")
    assert named["outbox.outbox_mark_delivered"] == q("outbox", "outbox_mark_delivered")
    cat = pgstats.Catalog.build(named, [])
    labels = {n for v in cat.statements.values() for n in v.split(" | ")}
    assert labels == set(named)
    # texts that only constants tell apart are few: a new one would name two statements
    # in the table at once
    shared = sorted(v for v in cat.statements.values() if " | " in v)
    assert len(shared) <= 3, shared


def row(query: str, top: bool = True, **counters: float) -> dict[str, Any]:
    return {
        "queryid": 1,
        "toplevel": top,
        "query": query,
        **dict.fromkeys(pgstats.STATEMENT_COUNTERS, 0),
        **counters,
    }


def test_statements_per_export_merge_divide_and_sort_by_wal_then_time() -> None:
    rows = [
        row(KEPT, calls=100, total_exec_time=50.0, wal_bytes=1_000_000, rows=100),
        row(KEPT.replace("LIMIT $8", "LIMIT $8 "), calls=100, wal_bytes=200_000),  # same name
        row("COMMIT", calls=300, total_exec_time=3.0),
        row("BEGIN", calls=300, total_exec_time=6.0),
        row("SELECT 'parsed, not run'"),
        row("INSERT INTO t VALUES (x, $2, $3)", top=False, calls=100, wal_bytes=50_000),
    ]
    out = pgstats.statements_per_export(rows, 100, catalog())
    assert [(s["statement"], s["level"]) for s in out] == [
        ("jobs.mine", "top"),
        ("f(): insert into t values (x, ?, ?)", "nested"),
        ("begin", "top"),
        ("commit", "top"),
    ]
    mine = out[0]
    assert mine["per_export"]["calls"] == 2
    assert mine["per_export"]["wal_bytes"] == 12_000
    assert mine["total"]["wal_bytes"] == 1_200_000
    assert mine["named"] is True
    total = pgstats.top_level_total(out)
    # the nested insert's WAL is inside its caller's already: not added again
    assert total["wal_bytes"] == 12_000
    assert total["calls"] == 8
    with pytest.raises(ValueError, match="nothing to divide"):
        pgstats.statements_per_export(rows, 0, catalog())


def test_tables_per_export_are_deltas_of_the_tables_that_changed() -> None:
    before = {
        "export_jobs": {"n_tup_ins": 10, "n_tup_upd": 20, "n_tup_hot_upd": 5, "n_tup_del": 0},
        "tenants": {"n_tup_ins": 1, "n_tup_upd": 0, "n_tup_hot_upd": 0, "n_tup_del": 0},
    }
    after = {
        "export_jobs": {"n_tup_ins": 110, "n_tup_upd": 220, "n_tup_hot_upd": 55, "n_tup_del": 0},
        "tenants": {"n_tup_ins": 1, "n_tup_upd": 0, "n_tup_hot_upd": 0, "n_tup_del": 0},
        "export_job_events": {"n_tup_ins": 400, "n_tup_upd": 0, "n_tup_hot_upd": 0, "n_tup_del": 0},
    }
    out = pgstats.tables_per_export(before, after, 100)
    assert [t["table"] for t in out] == ["export_job_events", "export_jobs"]
    jobs = out[1]
    assert jobs["per_export"] == {
        "n_tup_ins": 1,
        "n_tup_upd": 2,
        "n_tup_hot_upd": 0.5,
        "n_tup_del": 0,
    }
    assert jobs["total"]["n_tup_upd"] == 200
    with pytest.raises(ValueError):
        pgstats.tables_per_export(before, after, 0)


def phase(wal: float, with_commit: bool, events: float) -> dict[str, Any]:
    stmts = [
        {
            "statement": "jobs.job_submit",
            "level": "top",
            "named": True,
            "per_export": {**dict.fromkeys(pgstats.STATEMENT_COUNTERS, 0.0), "wal_bytes": wal},
        }
    ]
    if with_commit:
        stmts.append(
            {
                "statement": "commit",
                "level": "top",
                "named": False,
                "per_export": {**dict.fromkeys(pgstats.STATEMENT_COUNTERS, 0.0), "calls": 3.0},
            }
        )
    table = {"n_tup_ins": events, "n_tup_upd": 0, "n_tup_hot_upd": 0, "n_tup_del": 0}
    return {
        "statements": stmts,
        "tables": [{"table": "export_job_events", "per_export": table}],
    }


def test_summary_over_runs_is_the_median_with_a_missing_entry_as_zero() -> None:
    s = pgstats.summarize([phase(100, True, 4), phase(300, False, 4), phase(200, True, 5)])
    assert s["runs"] == 3
    by = {x["statement"]: x for x in s["statements"]}
    assert by["jobs.job_submit"]["per_export"]["wal_bytes"] == 200
    assert by["commit"]["per_export"]["calls"] == 3  # median of 3, 0, 3
    assert s["statements"][0]["statement"] == "jobs.job_submit"
    assert s["statements_top_level"]["wal_bytes"] == 200
    assert s["tables"][0]["per_export"]["n_tup_ins"] == 4


def test_the_report_tables_every_system_and_phase_recorded() -> None:
    zero = dict.fromkeys(pgstats.STATEMENT_COUNTERS, 0.0)
    runs = [
        {"sat": {"pg": phase(100, True, 4)}, "at50": {"pg": phase(90, True, 4)}},
        {"sat": {"pg": phase(120, True, 4)}},
    ]
    results = {"scenarios": {"e2e": {"systems": {"ours-lib": runs, "celery": [{"sat": {}}]}}}}
    per = report.pg_per_export(results)
    assert set(per) == {"ours-lib"}
    assert per["ours-lib"]["sat"]["runs"] == 2
    assert per["ours-lib"]["at50"]["runs"] == 1
    md = report.pg_markdown(per["ours-lib"]["sat"], top=1)
    assert "| `jobs.job_submit` | top | 0 | 0.000 | 0.000 | 110 |" in md
    assert "| 1 more (their top-level sum) | | 3 |" in md
    both = {"statement": "a.x | b.y", "level": "top", "named": True, "per_export": zero}
    assert "| `a.x \\| b.y` | top |" in report.pg_markdown({"statements": [both], "tables": []})
    assert "| **all top-level statements** | | 3 | 0.000 | 0.000 | 110 |" in md
    assert "| export_job_events | 4 | 0 | 0 | 0 |" in md
    assert "| (no table written) |" in report.pg_markdown({"statements": [], "tables": []})
    figs = report.footing_figures(runs[0])
    assert figs["sat.pg_statement_wal_bytes_per_job"] is None  # summarize() adds the totals
    recorded = {"sat": {"pg": {**phase(100, True, 4), "statements_top_level": {"wal_bytes": 7}}}}
    assert report.footing_figures(recorded)["sat.pg_statement_wal_bytes_per_job"] == 7
