"""Job transitions against real PostgreSQL: submit atomicity, claim, renew, finish."""

from __future__ import annotations

import threading
from uuid import uuid4

import psycopg
import pytest

from exportcore.domain import InvalidSelection, UnknownNotes
from exportcore.settings import Settings
from exportcore.store import jobs as job_store
from tests.support import count, events, job, shift_job, submit, tenant_with_notes


def _claim(pool, job_id, message_id=None, lease=30.0):
    with pool.connection() as conn:
        return job_store.job_claim(conn, job_id=job_id, message_id=message_id, lease_seconds=lease)


def test_submit_writes_job_snapshot_outbox_and_history_together(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    row = submit(pool, settings, tid, [*ids[:3], ids[0]])  # duplicate id is ignored
    assert row["status"] == "queued" and row["note_count"] == 3 and row["queue"] == "exports.fast"
    assert count(pool, "SELECT count(*) FROM export_job_items WHERE job_id = %s", row["id"]) == 3
    assert (
        count(
            pool,
            "SELECT count(*) FROM export_outbox WHERE job_id = %s AND sent_at IS NULL",
            row["id"],
        )
        == 1
    )
    assert [e["kind"] for e in events(pool, row["id"])] == ["submitted"]
    big = submit(pool, settings, tid, None)
    assert big["queue"] == "exports.bulk" and big["note_count"] == len(ids)


def test_snapshot_is_immutable_when_notes_change(pool, settings: Settings, tenant) -> None:
    """The snapshot names the version the submit saw; the text read back for it is that
    version's, from the version store once the note moved on (INV-18)."""
    tid, ids = tenant
    row = submit(pool, settings, tid, ids[:1])
    with pool.connection() as conn:
        before = job_store.job_items_chunk(
            conn, job_id=row["id"], after=0, limit=10, max_bytes=1 << 20
        )
        conn.execute("UPDATE notes SET content = 'changed later' WHERE id = %s", (ids[0],))
        [item] = job_store.job_items_chunk(
            conn, job_id=row["id"], after=0, limit=10, max_bytes=1 << 20
        )
        kept = conn.execute(
            "SELECT version FROM note_versions WHERE note_id = %s", (ids[0],)
        ).fetchall()
    assert item["content"] != "changed later" and not item["missing"]
    assert (item["content"], item["version"]) == (before[0]["content"], before[0]["version"])
    assert [k["version"] for k in kept] == [item["version"]]


@pytest.mark.parametrize(
    ("failing_table", "empty_tables"),
    [
        pytest.param(
            "export_outbox",
            ("export_jobs", "export_job_items", "export_outbox", "export_job_events"),
            id="between-job-and-outbox-insert-leaves-neither",
        ),
        # The snapshot insert comes after the job and outbox rows: failing it undoes both.
        pytest.param(
            "export_job_items",
            ("export_jobs", "export_outbox", "export_job_events"),
            id="after-outbox-insert-rolls-back-everything",
        ),
    ],
)
def test_a_failed_insert_during_submit_leaves_no_row(
    pool, settings: Settings, tenant, failing_table: str, empty_tables: tuple[str, ...]
) -> None:
    """A fault injected by the database itself (a trigger that raises before every insert
    into ``failing_table``): the submit raises and none of its rows is left anywhere."""
    tid, ids = tenant
    with pool.connection() as conn:
        conn.execute(
            f"""
            CREATE FUNCTION t_fail_insert() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'injected failure of an insert into {failing_table}'; END $$;
            CREATE TRIGGER t_fail_insert BEFORE INSERT ON {failing_table}
                FOR EACH ROW EXECUTE FUNCTION t_fail_insert();
            """
        )
    with pytest.raises(psycopg.errors.RaiseException):
        submit(pool, settings, tid, ids[:2])
    for table in empty_tables:
        assert count(pool, f"SELECT count(*) FROM {table}") == 0, table


def test_unknown_and_foreign_notes_are_rejected_without_writes(
    pool, settings: Settings, tenant, notes_dir
) -> None:
    tid, ids = tenant
    _, other_ids = tenant_with_notes(pool, notes_dir)
    with pytest.raises(UnknownNotes) as exc:
        submit(pool, settings, tid, [ids[0], 10**12, other_ids[0]])
    assert exc.value.extra["unknown_note_ids"] == sorted([10**12, other_ids[0]])
    with pytest.raises(InvalidSelection):
        submit(pool, settings.model_copy(update={"max_selection": 2}), tid, ids[:3])
    assert count(pool, "SELECT count(*) FROM export_jobs") == 0


def test_eight_threads_racing_to_claim_get_exactly_one_lease(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:2])["id"]
    barrier = threading.Barrier(8)
    results: list[object] = []

    def race() -> None:
        barrier.wait()
        results.append(_claim(pool, job_id, uuid4()))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r is not None]
    assert len(results) == 8 and len(winners) == 1
    row = job(pool, job_id)
    assert row["attempts"] == 1 and row["lease_token"] == winners[0].lease_token  # type: ignore[attr-defined]
    assert [e["kind"] for e in events(pool, job_id)].count("claimed") == 1


def test_claim_refuses_not_due_and_terminal_jobs_without_consuming_attempts(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    shift_job(pool, job_id, next_attempt_at="+1 hour")
    assert _claim(pool, job_id) is None
    assert job(pool, job_id)["attempts"] == 0
    shift_job(pool, job_id, next_attempt_at="-1 hour")
    claimed = _claim(pool, job_id)
    assert claimed is not None and claimed.attempts == 1
    with pool.connection() as conn:
        done = job_store.job_finish_if_leased(
            conn,
            job_id=job_id,
            lease_token=claimed.lease_token,
            result_ref="r",
            sha256="s",
            nbytes=1,
            rows=1,
        )
    assert done is not None and done.status == "succeeded"
    assert _claim(pool, job_id) is None  # duplicate message after success
    assert job(pool, job_id)["attempts"] == 1
    with pool.connection() as conn:
        assert job_store.job_claim_refusal(conn, job_id=job_id)["status"] == "succeeded"


def test_claim_refuses_past_deadline_cancelled_and_exhausted(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    late = submit(pool, settings, tid, ids[:1])["id"]
    shift_job(pool, late, deadline_at="-2 hours")
    assert _claim(pool, late) is None
    cancelled = submit(pool, settings, tid, ids[:1])["id"]
    with pool.connection() as conn:
        conn.execute("UPDATE export_jobs SET cancel_requested = true WHERE id = %s", (cancelled,))
    assert _claim(pool, cancelled) is None
    exhausted = submit(pool, settings, tid, ids[:1])["id"]
    with pool.connection() as conn:
        conn.execute("UPDATE export_jobs SET attempts = max_attempts WHERE id = %s", (exhausted,))
    assert _claim(pool, exhausted) is None
    assert [job(pool, j)["attempts"] for j in (late, cancelled)] == [0, 0]


def test_finish_with_stale_token_is_refused_and_result_unchanged(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    first = _claim(pool, job_id)
    # The first lease expires; recovery puts the job back and a second worker claims it.
    shift_job(pool, job_id, lease_expires_at="-1 minute")
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_jobs SET status = 'queued', lease_token = NULL, lease_expires_at = NULL"
            " WHERE id = %s",
            (job_id,),
        )
    second = _claim(pool, job_id)
    assert second is not None and second.lease_token != first.lease_token
    with pool.connection() as conn:
        stale = job_store.job_finish_if_leased(
            conn,
            job_id=job_id,
            lease_token=first.lease_token,
            result_ref="stale",
            sha256="x",
            nbytes=1,
            rows=1,
        )
        assert stale is None
        renewed = job_store.job_renew_lease(
            conn, job_id=job_id, lease_token=first.lease_token, lease_seconds=30, progress=0
        )
        assert renewed is None
        won = job_store.job_finish_if_leased(
            conn,
            job_id=job_id,
            lease_token=second.lease_token,
            result_ref="winner",
            sha256="y",
            nbytes=2,
            rows=1,
        )
    assert won is not None
    row = job(pool, job_id)
    assert (row["status"], row["result_ref"], row["attempts"]) == ("succeeded", "winner", 2)


def test_finish_refused_after_lease_expiry_or_cancel(pool, settings: Settings, tenant) -> None:
    tid, ids = tenant
    expired = submit(pool, settings, tid, ids[:1])["id"]
    lease = _claim(pool, expired).lease_token
    shift_job(pool, expired, lease_expires_at="-1 hour")
    cancelled = submit(pool, settings, tid, ids[:1])["id"]
    lease2 = _claim(pool, cancelled).lease_token
    with pool.connection() as conn:
        conn.execute("UPDATE export_jobs SET cancel_requested = true WHERE id = %s", (cancelled,))
        for jid, tok in ((expired, lease), (cancelled, lease2)):
            assert (
                job_store.job_finish_if_leased(
                    conn, job_id=jid, lease_token=tok, result_ref="r", sha256="s", nbytes=1, rows=1
                )
                is None
            )
            assert (
                job_store.job_renew_lease(
                    conn, job_id=jid, lease_token=tok, lease_seconds=30, progress=0
                )
                is None
            )
    assert job(pool, expired)["status"] == "running" and job(pool, expired)["result_ref"] is None


def test_renew_extends_only_the_current_lease(pool, settings: Settings, tenant) -> None:
    tid, ids = tenant
    job_id = submit(pool, settings, tid, ids[:1])["id"]
    claimed = _claim(pool, job_id, lease=5)
    with pool.connection() as conn:
        renewed = job_store.job_renew_lease(
            conn, job_id=job_id, lease_token=claimed.lease_token, lease_seconds=120, progress=7
        )
    assert renewed is not None and renewed["lease_expires_at"] > claimed.lease_expires_at
    renew_events = [e for e in events(pool, job_id) if e["kind"] == "renewed"]
    assert renew_events and renew_events[0]["detail"]["progress"] == 7


ORPHANS = {
    table: f"SELECT count(*) FROM {table} c WHERE NOT EXISTS "
    "(SELECT 1 FROM export_jobs j WHERE j.id = c.job_id)"
    for table in ("export_job_items", "export_outbox", "export_job_events")
}


def test_a_whole_life_leaves_no_child_row_without_its_job(pool, settings: Settings, tenant) -> None:
    """docs/architecture.md INV-17 children-with-their-job, with no foreign key to check it:
    submits, a claim taking a backlog, finishes, a failure and its replay, a cancel while
    queued (its event dropped by the publisher's claim), retention and an operator's manual
    delete: no snapshot item, outbox event or history row outlives its job, and deleting
    jobs deletes theirs."""
    from exportcore.artifacts import FileArtifactStore
    from exportcore.broker import make_celery
    from exportcore.cancel import request_cancel
    from exportcore.domain import FAST_QUEUE
    from exportcore.publisher import Publisher
    from exportcore.replays import replay_export
    from exportcore.runner import JobRunner

    tid, ids = tenant
    done, failing, queued_cancel, beside, taken = (
        submit(pool, settings, tid, ids[i : i + 1])["id"] for i in range(5)
    )
    request_cancel(pool, tenant_id=tid, job_id=queued_cancel)
    publisher = Publisher(settings, pool, make_celery(settings))
    assert publisher.run_once()["published"] == 2  # two messages ahead; the cancelled dropped
    runner = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir))
    with pool.connection() as conn:
        [message] = conn.execute(
            "SELECT id FROM export_outbox WHERE job_id = %s", (done,)
        ).fetchall()
    outcomes = runner.run_batch([(done, message["id"])], queue=FAST_QUEUE, carrier=message["id"])
    assert {o.job_id for o in outcomes} >= {done, beside, taken}  # the claim took them
    for row in (_claim(pool, failing),):
        assert row is not None
        with pool.connection() as conn:
            job_store.job_fail_if_leased_many(
                conn, [job_store.Fail(failing, row.token, "invalid_snapshot", "broken")]
            )
    replayed = replay_export(pool, settings, original_id=failing, actor="test").job
    runner.run(replayed["id"], None)
    assert count(pool, "SELECT count(*) FROM export_job_events WHERE job_id = %s", failing) >= 4
    for table, sql in ORPHANS.items():
        assert count(pool, sql) == 0, table
    before = {
        table: count(pool, f"SELECT count(*) FROM {table} WHERE job_id = ANY(%s)", [done, taken])
        for table in ORPHANS
    }
    assert all(before.values())
    shift_job(pool, done, created_at="-40 days")
    with pool.connection() as conn:
        conn.execute(
            "UPDATE export_jobs SET finished_at = now() - interval '31 days' WHERE id = %s",
            (done,),
        )
        assert [
            r["id"] for r in job_store.job_delete_terminal_before(conn, retention_days=30, limit=10)
        ] == [done]
        conn.execute("DELETE FROM export_jobs WHERE id = %s", (taken,))  # by hand
    for table, sql in ORPHANS.items():
        assert count(pool, sql) == 0, table
        assert (
            count(pool, f"SELECT count(*) FROM {table} WHERE job_id = ANY(%s)", [done, taken]) == 0
        )
