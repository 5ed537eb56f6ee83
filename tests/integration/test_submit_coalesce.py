"""Concurrent submits of one api process sharing one statement and one commit
(exportcore.coalesce, ``job_submit_many``), on real PostgreSQL: each row is its own submit
— its own admission (INV-9), its own refusal, its own answer — and a statement that fails
loses none of them."""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest

from exportcore.admission import QuotaExceeded
from exportcore.coalesce import SubmitCoalescer
from exportcore.domain import ExportFormat, ExportRequest, UnknownNotes
from exportcore.settings import Settings
from exportcore.store import admission as admission_store
from exportcore.store import jobs as job_store
from exportcore.store.jobs import SubmitRow
from exportcore.store.tenants import tenant_set_quota
from exportcore.submit import submit_export
from tests.support import count, kinds, run_queued, tenant_with_notes


def row(tid: str, note_ids: list[int], job_id: UUID | None = None) -> SubmitRow:
    request = ExportRequest.build(ExportFormat.JSON, note_ids, False)
    return SubmitRow(
        job_id or uuid4(),
        uuid4(),
        tid,
        "json",
        request.canonical(),
        request.note_ids or (),
        request.request_hash(),
        event_detail={"source": "test"},
    )


def many(pool, settings: Settings, rows: list[SubmitRow]) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        return job_store.job_submit_many(conn, rows, **job_store.submit_limits(settings))


def test_each_row_of_a_shared_statement_is_its_own_submit(
    pool, settings: Settings, tenant, notes_dir
) -> None:
    a, a_ids = tenant
    b, b_ids = tenant_with_notes(pool, notes_dir)
    with pool.connection() as conn:
        tenant_set_quota(conn, tenant_id=b, quota=1)
    rows = [
        row(a, a_ids[:3]),
        row(a, [a_ids[0], b_ids[0]]),  # another tenant's note: refused, nothing written
        row(b, b_ids[:1]),
        row(b, b_ids[1:2]),  # b's quota is 1: refused by admission, nothing written
        row(a, a_ids[3:4]),
    ]
    out = many(pool, settings, rows)
    assert [r["n"] for r in out] == [1, 2, 3, 4, 5]
    assert [r["id"] for r in out] == [rows[0].job_id, None, rows[2].job_id, None, rows[4].job_id]
    assert out[1]["selected"] == 1 and out[1]["refusal"] is None
    assert out[3]["refusal"] == "XEX02" and "quota" in out[3]["detail"]
    assert [out[i]["snapshot_count"] for i in (0, 2, 4)] == [3, 1, 1]
    for i in (0, 2, 4):
        assert kinds(pool, rows[i].job_id) == ["submitted"]
        assert out[i]["queue"] == "exports.fast" and out[i]["message_id"] == rows[i].message_id
    assert count(pool, "SELECT count(*) FROM export_jobs") == 3
    assert count(pool, "SELECT count(*) FROM export_outbox") == 3
    assert count(pool, "SELECT count(DISTINCT created_at) FROM export_jobs") == 1  # one commit
    with pool.connection() as conn:
        assert admission_store.admission_counters(conn) == {"*": 3, a: 2, b: 1}


def gated(coalescer: SubmitCoalescer) -> threading.Event:
    """Hold the coalescer's first lone write until the returned event is set (so that the
    submits started meanwhile queue behind it, as concurrent requests do)."""
    gate = threading.Event()
    write_one = coalescer.write_one

    def held(r: SubmitRow) -> dict[str, Any]:
        gate.wait(10)
        return write_one(r)

    coalescer.write_one = held
    return gate


def test_concurrent_submits_share_a_statement_and_each_answers_for_its_own_row(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    coalescer = SubmitCoalescer(pool, settings)
    gate = gated(coalescer)
    answers: dict[int, Any] = {}

    def send(i: int) -> None:
        note_ids = [10**12 + i] if i % 4 == 3 else ids[i : i + 1]  # every 4th: unknown id
        request = ExportRequest.build(ExportFormat.JSON, note_ids, False)
        try:
            answers[i] = submit_export(
                pool, settings, tenant_id=tid, request=request, coalescer=coalescer
            ).job
        except UnknownNotes as exc:
            answers[i] = exc

    run_queued(coalescer, gate, [threading.Thread(target=send, args=(i,)) for i in range(9)])
    refused = {i for i, a in answers.items() if isinstance(a, UnknownNotes)}
    assert refused == {3, 7}
    jobs = {i: a["id"] for i, a in answers.items() if i not in refused}
    assert len(jobs) == 7 and count(pool, "SELECT count(*) FROM export_jobs") == 7
    # the lone first write, then ONE statement for the six others that were accepted
    assert count(pool, "SELECT count(DISTINCT created_at) FROM export_jobs") == 2
    for job_id in jobs.values():
        assert count(pool, "SELECT count(*) FROM export_job_items WHERE job_id = %s", job_id) == 1


def test_a_shared_statement_that_fails_writes_each_submit_alone(
    pool, settings: Settings, tenant
) -> None:
    """One row breaks the whole statement (here its job id is taken: a unique violation):
    PostgreSQL rolled it back, so every row is written again alone; only that one fails."""
    tid, ids = tenant
    taken = submit_export(
        pool,
        settings,
        tenant_id=tid,
        request=ExportRequest.build(ExportFormat.JSON, ids[:1], False),
    ).job["id"]
    coalescer = SubmitCoalescer(pool, settings)
    gate = gated(coalescer)
    rows = [row(tid, ids[i : i + 1]) for i in range(1, 5)]
    rows[2] = row(tid, ids[3:4], job_id=taken)
    answers: dict[int, Any] = {}

    def send(i: int) -> None:
        try:
            answers[i] = coalescer.submit(rows[i])
        except psycopg.Error as exc:
            answers[i] = exc

    run_queued(coalescer, gate, [threading.Thread(target=send, args=(i,)) for i in range(4)])
    assert isinstance(answers[2], psycopg.errors.UniqueViolation)
    assert [answers[i]["id"] for i in (0, 1, 3)] == [rows[i].job_id for i in (0, 1, 3)]
    assert count(pool, "SELECT count(*) FROM export_jobs") == 4


def test_admission_refuses_the_rows_past_the_quota_in_a_shared_statement(
    pool, settings: Settings, tenant
) -> None:
    """Rows admitted earlier in the statement count against the later ones (INV-9)."""
    tid, ids = tenant
    with pool.connection() as conn:
        tenant_set_quota(conn, tenant_id=tid, quota=2)
    out = many(pool, settings, [row(tid, ids[i : i + 1]) for i in range(4)])
    assert [r["refusal"] for r in out] == [None, None, "XEX02", "XEX02"]
    coalescer = SubmitCoalescer(pool, settings)
    with pytest.raises(QuotaExceeded):
        submit_export(
            pool,
            settings,
            tenant_id=tid,
            request=ExportRequest.build(ExportFormat.JSON, ids[5:6], False),
            coalescer=coalescer,
        )
