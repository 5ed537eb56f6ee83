"""The metadata and tags filters are served by the partial GIN index of migration 0025
(``export_jobs_labels_idx``) at 1,000,000 jobs, and exports without labels put nothing in it.

The jobs are generated set-based (``generate_series``) in a database of this module: one
tenant with 1,000,000 succeeded jobs, one in 100 of them labelled (a team tag, ``nightly``,
a unique ``order_id``), five with the rare tag ``audit``; then VACUUM ANALYZE. What is
checked is the plan PostgreSQL chooses (EXPLAIN, never a timing): a bitmap scan of the index
for a selective filter, for the custom plan of the values (the api sends the statement
unprepared the first times) and for the generic plan a prepared statement ends up with.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from devtools.stack import Servers
from exportcore.sql import q

JOBS = 1_000_000
LABELLED_EVERY = 100
INDEX = "export_jobs_labels_idx"
TENANT = "plan-big"

FILL = f"""
INSERT INTO export_jobs (
    id, tenant_id, status, queue, format, payload, note_count, request_hash, attempts,
    max_attempts, deadline_at, result_rows, result_bytes, result_sha256, result_ref,
    created_at, started_at, finished_at, updated_at)
SELECT gen_random_uuid(), '{TENANT}', 'succeeded', 'exports.fast', 'json',
       jsonb_build_object('selection', '{{"note_ids": [1, 2, 3]}}'::jsonb, 'format', 'json',
                          'options', '{{}}'::jsonb)
       || CASE WHEN g % {LABELLED_EVERY} = 0 THEN jsonb_build_object('labels', jsonb_build_object(
              'tags', CASE WHEN g <= 5 * {LABELLED_EVERY}
                           THEN jsonb_build_array('audit', 'nightly', 'team-' || (g % 7))
                           ELSE jsonb_build_array('nightly', 'team-' || (g % 7)) END,
              'metadata', jsonb_build_object('order_id', 'ord_' || g, 'team', (g % 7)::text)))
          ELSE '{{}}'::jsonb END,
       3, md5(g::text), 1, 3, now() + interval '1 hour', 3, 900, md5(g::text) || md5(g::text),
       'k/' || g, t, t, t, t
FROM (SELECT g, now() - make_interval(secs => g) AS t
      FROM generate_series(1, {JOBS}) AS g) s
"""


@pytest.fixture(scope="module")
def big_db(servers: Servers, template_db: str) -> Iterator[str]:
    name = f"t_labels_plan_{uuid4().hex[:8]}"
    url = servers.create_database(name, template=template_db)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO tenants (id, name) VALUES (%s, 'plans')", (TENANT,))
            conn.execute("INSERT INTO tenants (id, name) VALUES ('plan-small', 'plans')")
            conn.execute(FILL)
            conn.execute("VACUUM ANALYZE export_jobs")
        yield url
    finally:
        servers.drop_database(name)


def _params(labels: dict[str, Any], status: str | None = None) -> dict[str, Any]:
    return {
        "tenant_id": TENANT,
        "labels": Jsonb(labels),
        "status": status,
        "before_created_at": None,
        "before_id": None,
        "limit": 51,
    }


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _index_names(plan: dict[str, Any]) -> set[str]:
    return {n["Index Name"] for n in _nodes(plan) if "Index Name" in n}


def custom_plan(url: str, params: dict[str, Any]) -> dict[str, Any]:
    statement = q("jobs", "job_list_for_tenant_labelled")
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f"EXPLAIN (FORMAT JSON) {statement}", params, prepare=False).fetchone()
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]


def generic_plan(url: str, params: dict[str, Any]) -> dict[str, Any]:
    """The plan a prepared statement ends up with once PostgreSQL goes generic (forced)."""
    names: list[str] = []

    def placeholder(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    statement = re.sub(r"%\((\w+)\)s", placeholder, q("jobs", "job_list_for_tenant_labelled"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE labelled AS {statement}")
        args = sql.SQL(", ").join(sql.Literal(params[n]) for n in names)
        row = conn.execute(
            sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE labelled({})").format(args)
        ).fetchone()
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]


SELECTIVE = [
    pytest.param({"metadata": {"order_id": "ord_500"}}, None, id="a-unique-metadata-value"),
    pytest.param({"tags": ["audit"]}, None, id="a-rare-tag"),
    pytest.param(
        {"tags": ["nightly"], "metadata": {"order_id": "ord_700"}}, None, id="a-tag-and-a-pair"
    ),
    pytest.param({"tags": ["audit"]}, "succeeded", id="a-rare-tag-and-a-status"),
]


@pytest.mark.parametrize(("labels", "status"), SELECTIVE)
def test_a_selective_filter_reads_the_labels_index(big_db, labels, status) -> None:
    plan = custom_plan(big_db, _params(labels, status))
    assert INDEX in _index_names(plan), plan
    assert not any(n["Node Type"] == "Seq Scan" for n in _nodes(plan)), plan


@pytest.mark.parametrize(("labels", "status"), SELECTIVE[:2])
def test_the_generic_plan_reads_the_labels_index_too(big_db, labels, status) -> None:
    plan = generic_plan(big_db, _params(labels, status))
    assert INDEX in _index_names(plan), plan
    assert not any(n["Node Type"] == "Seq Scan" for n in _nodes(plan)), plan


def test_the_filter_finds_exactly_the_labelled_jobs(big_db) -> None:
    statement = q("jobs", "job_list_for_tenant_labelled")
    with psycopg.connect(big_db, autocommit=True) as conn:
        rows = conn.execute(statement, _params({"tags": ["audit"]}), prepare=False).fetchall()
        assert len(rows) == 5
        one = conn.execute(
            statement, _params({"metadata": {"order_id": "ord_500", "team": str(500 % 7)}})
        ).fetchall()
        assert len(one) == 1
        none = conn.execute(
            statement, {**_params({"tags": ["audit"]}), "tenant_id": "plan-small"}
        ).fetchall()
        assert none == []


def test_exports_without_labels_are_not_in_the_index(big_db) -> None:
    """The index holds the labelled 1 % only: its size is that of 10,000 entries, a small
    fraction of the table's primary key (one entry per job), because the predicate
    ``payload ? 'labels'`` is false for the other 990,000 jobs."""
    with psycopg.connect(big_db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_relation_size(%s::regclass) AS labels,"
            " pg_relation_size('export_jobs_pkey'::regclass) AS pkey,"
            " (SELECT count(*) FROM export_jobs WHERE payload ? 'labels') AS labelled",
            (INDEX,),
        ).fetchone()
    assert row is not None
    labels, pkey, labelled = row
    assert labelled == JOBS // LABELLED_EVERY
    assert labels * 10 < pkey, (labels, pkey)
