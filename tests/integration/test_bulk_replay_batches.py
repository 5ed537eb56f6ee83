"""A bulk replay written set-based, a batch per statement (``job_replay_many``): each dead
letter is replayed once when single replays and a second bulk replay race it, a repeated
bulk replay acts on nothing new, and a batch that admission control refuses for one of its
tenants replays what was admitted before the refusal, stops, and loses nothing."""

from __future__ import annotations

import threading
from typing import Any
from uuid import uuid4

from exportcore import bulk
from exportcore.audit import Actor
from exportcore.replays import replay_export
from exportcore.store import admission as admission_store
from exportcore.store import tenants as tenant_store
from tests.support import count, failed, tenant_with_notes

ADMIN = Actor(kind="operator", name="nex_op_test (tests)")


def _start(pool: Any, reason: str, confirmed: int) -> dict[str, Any]:
    seen = bulk.preview(pool, "replay", bulk.BulkFilter(reason=reason))
    run, _ = bulk.start(
        pool,
        ADMIN,
        "replay",
        seen.filter,
        as_of=seen.as_of,
        confirmed=confirmed,
        request_id=uuid4(),
    )
    return run


def _replays_per_original(pool: Any, reason: str) -> dict[Any, int]:
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT d.job_id, count(r.id) AS n FROM export_dead_letters d "
            "LEFT JOIN export_jobs r ON r.replay_of = d.job_id "
            "WHERE d.reason = %s GROUP BY d.job_id",
            (reason,),
        ).fetchall()
    return {r["job_id"]: r["n"] for r in rows}


def _assert_whole(pool: Any, reason: str) -> None:
    """Every replay has its snapshot, one outbox event and both history events; every dead
    letter is either open without a replay or replayed by exactly its one replay; and the
    admission counters agree with the rows."""
    bad = count(
        pool,
        "SELECT count(*) FROM export_dead_letters d LEFT JOIN export_jobs r "
        "ON r.replay_of = d.job_id WHERE d.reason = %s AND NOT ("
        "(d.state = 'open' AND r.id IS NULL) OR "
        "(d.state = 'replayed' AND r.id = d.replay_job_id AND r.status = 'queued'"
        " AND (SELECT count(*) FROM export_outbox o WHERE o.job_id = r.id) = 1"
        " AND (SELECT count(*) FROM export_job_items i WHERE i.job_id = r.id) > 0"
        " AND (SELECT count(*) FROM export_job_events e WHERE e.job_id = r.id"
        "      AND e.kind = 'submitted') = 1"
        " AND (SELECT count(*) FROM export_job_events e WHERE e.job_id = d.job_id"
        "      AND e.kind = 'replayed') = 1))",
        reason,
    )
    assert bad == 0
    with pool.connection() as conn:
        counters = admission_store.admission_counters(conn)
        rows = conn.execute(
            "SELECT tenant_id, count(*) AS n FROM export_jobs "
            "WHERE status IN ('queued', 'running') GROUP BY tenant_id"
        ).fetchall()
    assert {r["tenant_id"]: r["n"] for r in rows} == {
        k: v for k, v in counters.items() if k != "*" and v
    }
    assert counters.get("*", 0) == sum(r["n"] for r in rows)


def test_a_bulk_replay_racing_single_replays_and_another_bulk_replays_each_once(
    pool, settings, tenant
) -> None:
    bad = [failed(pool, settings, tenant[0], tenant[1], code="race_many") for _ in range(30)]
    runs = [_start(pool, "race_many", 30), _start(pool, "race_many", 30)]
    errors: list[BaseException] = []
    single: list[Any] = []

    def guarded(fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            out = fn(*args, **kwargs)
            if fn is replay_export:
                single.append(out)
        except Exception as exc:
            errors.append(exc)

    threads = [
        threading.Thread(
            target=guarded, args=(bulk.run, pool, settings, r["id"]), kwargs={"batch_size": 8}
        )
        for r in runs
    ] + [
        threading.Thread(
            target=guarded,
            args=(replay_export, pool, settings),
            kwargs={"original_id": b["id"], "actor": ADMIN},
        )
        for b in bad[::2]
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert set(_replays_per_original(pool, "race_many").values()) == {1}
    with pool.connection() as conn:
        ended = conn.execute(
            "SELECT state, acted, skipped, batches FROM bulk_actions ORDER BY id"
        ).fetchall()
    assert [r["state"] for r in ended] == ["done", "done"]
    written_by_single = sum(1 for s in single if s.created)
    assert sum(r["acted"] for r in ended) + written_by_single == 30
    _assert_whole(pool, "race_many")


def test_a_repeated_bulk_replay_acts_on_nothing_new(pool, settings, tenant) -> None:
    for _ in range(12):
        failed(pool, settings, tenant[0], tenant[1], code="again")
    first = bulk.run(pool, settings, _start(pool, "again", 12)["id"], batch_size=5)
    assert (first["state"], first["acted"], first["batches"]) == ("done", 12, 3)
    second = bulk.run(pool, settings, _start(pool, "again", 12)["id"], batch_size=5)
    assert (second["state"], second["acted"]) == ("done", 0)
    # the same run again (its request posted twice) is left as it ended
    assert bulk.run(pool, settings, first["id"])["acted"] == 12
    assert set(_replays_per_original(pool, "again").values()) == {1}
    with pool.connection() as conn:
        audited = conn.execute(
            "SELECT count, outcome FROM operator_actions WHERE action = 'bulk_replay' ORDER BY id"
        ).fetchall()
    assert [(a["count"], a["outcome"]) for a in audited] == [(12, "done"), (0, "done")]
    _assert_whole(pool, "again")


def test_a_batch_one_tenant_of_which_is_over_quota_replays_up_to_the_refusal(
    pool, settings, tenant, notes_dir
) -> None:
    other = tenant_with_notes(pool, notes_dir)
    # dead letters alternate between the two tenants, so every batch holds both
    for _ in range(6):
        failed(pool, settings, tenant[0], tenant[1], code="mixed")
        failed(pool, settings, other[0], other[1], code="mixed")
    with pool.connection() as conn:
        tenant_store.tenant_set_quota(conn, tenant_id=other[0], quota=2)
    run = bulk.run(pool, settings, _start(pool, "mixed", 12)["id"], batch_size=12)
    # the batch (both tenants) was refused as a whole, then redone one dead letter per
    # transaction up to the first refusal: the other tenant's third dead letter, the sixth
    assert run["state"] == "stopped"
    assert "admission refused (quota_exceeded)" in run["stop_reason"]
    assert run["acted"] == 5  # three of the first tenant, two of the other
    left = count(
        pool, "SELECT count(*) FROM export_dead_letters WHERE reason = 'mixed' AND state = 'open'"
    )
    assert left == 7
    _assert_whole(pool, "mixed")
    # nothing lost: with room again, the same filter replays exactly the rest
    with pool.connection() as conn:
        tenant_store.tenant_set_quota(conn, tenant_id=other[0], quota=None)
    rest = bulk.run(pool, settings, _start(pool, "mixed", 12)["id"], batch_size=12)
    assert (rest["state"], rest["acted"]) == ("done", 7)
    assert set(_replays_per_original(pool, "mixed").values()) == {1}
    _assert_whole(pool, "mixed")
