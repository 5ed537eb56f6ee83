"""The autoscaler's backlog query, as the chart renders it, on the real migrated schema.

KEDA's postgresql trigger runs the rendered ``query`` of each worker's ScaledObject every
polling interval as the read-only role of ``files/keda/reader-role.sql``. Here: the same
text, as that role (created from the same file with psql), against jobs in every state: it
counts the running and the due queued jobs of its queue only, the role reads nothing else and
writes nothing, and an index-only scan of ``export_jobs_backlog_idx`` serves it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from exportcore.settings import Settings
from exportcore.store.jobs import job_claim_many
from tests.chart.conftest import CHART, by_kind, render
from tests.support import shift_job, submit, tenant_with_notes

pytestmark = pytest.mark.chart
ROLE = "notes_exports_keda"


def _queries(objs: list[dict[str, Any]]) -> dict[str, str]:
    """{queue: rendered query} of the postgresql triggers."""
    out = {}
    for so in by_kind(objs, "ScaledObject"):
        (trigger,) = so["spec"]["triggers"]
        assert trigger["type"] == "postgresql", so["metadata"]["name"]
        name = so["spec"]["scaleTargetRef"]["name"]
        out["exports.bulk" if name.endswith("bulk-worker") else "exports.fast"] = trigger[
            "metadata"
        ]["query"]
    return out


@pytest.fixture(scope="module")
def queries() -> dict[str, str]:
    """The rendered queries of production-values' ScaledObjects (rendered once)."""
    return _queries(render([CHART / "ci" / "production-values.yaml"]))


def _reader_url(database_url: str) -> str:
    """The test database's URL with the read-only role's credentials."""
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    info.update(user=ROLE, password="keda-test-only")
    return psycopg.conninfo.make_conninfo(**info)  # type: ignore[arg-type]


@pytest.fixture
def reader(database_url: str) -> Any:
    """The role of files/keda/reader-role.sql, created by psql as the documentation says."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {ROLE}")
    proc = subprocess.run(
        ["psql", database_url, "-v", "ON_ERROR_STOP=1", "-v", "password=keda-test-only",
         "-f", str(CHART / "files" / "keda" / "reader-role.sql")],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    yield _reader_url(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {ROLE}")
        conn.execute(f"DROP ROLE {ROLE}")


def test_the_rendered_query_counts_due_and_running_jobs_of_its_queue(
    pool, settings: Settings, notes_dir: Path, reader: str, queries: dict[str, str]
) -> None:
    assert set(queries) == {"exports.fast", "exports.bulk"}
    tid, ids = tenant_with_notes(pool, notes_dir)
    fast = [submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(6)]
    bulk = [submit(pool, settings, tid, None)["id"] for _ in range(3)]
    with pool.connection() as conn:
        job_claim_many(conn, job_ids=fast[:2] + bulk[:1], message_ids=[uuid4() for _ in range(3)],
                       lease_seconds=30)  # fmt: skip
        conn.execute("UPDATE export_jobs SET status = 'cancelled', finished_at = now() "
                     "WHERE id = ANY(%s)", ([fast[2], bulk[2]],))  # fmt: skip
    shift_job(pool, fast[3], next_attempt_at="+1 hour")  # waiting out a retry backoff
    with psycopg.connect(reader) as conn:
        counts = {q: conn.execute(sql).fetchone()[0] for q, sql in queries.items()}  # type: ignore[index]
    # fast: 2 running + 2 due queued (one cancelled, one not due); bulk: 1 running + 1 queued
    assert counts == {"exports.fast": 4.0, "exports.bulk": 2.0}


def test_the_reader_role_reads_only_the_backlog_columns_and_writes_nothing(reader: str) -> None:
    with psycopg.connect(reader, autocommit=True) as conn:
        for sql in (
            "SELECT payload FROM export_jobs",
            "SELECT tenant_id FROM export_jobs",
            "SELECT * FROM notes",
            "SELECT * FROM export_outbox",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TEMP TABLE x (i int)")
        assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("on",)


def test_an_index_only_scan_serves_the_query(database_url: str, queries: dict[str, str]) -> None:
    sql = queries["exports.fast"]
    with psycopg.connect(database_url) as conn:
        conn.execute("ANALYZE export_jobs")
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {sql}"))
    assert "Index Only Scan using export_jobs_backlog_idx" in plan, plan
