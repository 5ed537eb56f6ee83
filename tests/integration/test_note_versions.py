"""Snapshots by reference (docs/architecture.md INV-18 snapshot-by-reference): the note
triggers keep every superseded version, the render reads each item at its recorded
version, and the pruner deletes a version only when no job that may still render names it
and no transaction that may still reference it is in progress."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from alembic import command
from alembic.config import Config

from devtools.stack import ROOT, Servers
from exportcore.artifacts import FileArtifactStore
from exportcore.db import transaction
from exportcore.domain import ExportError, ExportFormat, ExportRequest
from exportcore.note_versions import VersionPruner
from exportcore.recovery import RecoveryScanner
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.store import jobs as job_store
from exportcore.submit import SelectionChanged, submit_in_transaction
from tests.support import create_tenant, job, submit


def _notes(pool: Any, tid: str, n: int) -> list[int]:
    """``n`` notes whose content names their id and version (``"<id>:<version>"``)."""
    with pool.connection() as conn:
        rows = conn.execute(
            "INSERT INTO notes (tenant_id, title, content, pinned, updated_at)"
            " SELECT %s, 'note ' || g, 'pending', false, now() FROM generate_series(1, %s) g"
            " RETURNING id",
            (tid, n),
        ).fetchall()
        ids = [r["id"] for r in rows]
        conn.execute(
            "UPDATE notes SET content = id || ':' || (version + 1) WHERE id = ANY(%s)", (ids,)
        )
        conn.execute("DELETE FROM note_versions WHERE note_id = ANY(%s)", (ids,))
    return ids


def _bump(conn: Any, note_id: int) -> None:
    """A new version of the note, its content derived from the version number."""
    conn.execute(
        "UPDATE notes SET content = id || ':' || (version + 1), updated_at = now() WHERE id = %s",
        (note_id,),
    )


def _chunk(pool: Any, job_id: UUID) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        return job_store.job_items_chunk(
            conn, job_id=job_id, after=0, limit=10_000, max_bytes=1 << 30
        )


def _versions(pool: Any, note_id: int) -> list[int]:
    with pool.connection() as conn:
        return [
            r["version"]
            for r in conn.execute(
                "SELECT version FROM note_versions WHERE note_id = %s ORDER BY version",
                (note_id,),
            )
        ]


def _artifact(settings: Settings, row: dict[str, Any]) -> list[dict[str, Any]]:
    doc = json.loads((Path(settings.artifact_dir) / row["result_ref"]).read_bytes())
    return list(doc["notes"])


def test_the_triggers_keep_every_superseded_version(pool, settings: Settings) -> None:
    tid = create_tenant(pool)
    a, b = _notes(pool, tid, 2)
    with pool.connection() as conn:
        _bump(conn, a)  # 2 -> 3
        conn.execute("UPDATE notes SET content = content WHERE id = %s", (a,))  # no change
        conn.execute("DELETE FROM notes WHERE id = %s", (b,))  # version 2 superseded
        # the same id again continues after its tombstone (version 3): never version 1 again
        again = conn.execute(
            "INSERT INTO notes (id, tenant_id, title, content, pinned, updated_at)"
            " OVERRIDING SYSTEM VALUE VALUES (%s, %s, 'again', 'x', false, now()) RETURNING version",
            (b, tid),
        ).fetchone()
        kept = conn.execute(
            "SELECT note_id, version, content FROM note_versions WHERE note_id = ANY(%s)"
            " ORDER BY note_id, version",
            ([a, b],),
        ).fetchall()
    assert again is not None and again["version"] == 4
    assert [(k["note_id"], k["version"], k["content"]) for k in kept] == [
        (a, 2, f"{a}:2"),
        (b, 2, f"{b}:2"),
    ]


def test_a_render_reads_each_note_at_its_recorded_version(pool, settings: Settings) -> None:
    """Updated, deleted, deleted and inserted again after the submit: the artifact holds the
    versions the submit saw."""
    tid = create_tenant(pool)
    ids = _notes(pool, tid, 3)
    row = submit(pool, settings, tid, ids)
    with pool.connection() as conn:
        _bump(conn, ids[0])
        conn.execute("DELETE FROM notes WHERE id = %s", (ids[1],))
        conn.execute("DELETE FROM notes WHERE id = %s", (ids[2],))
        conn.execute(
            "INSERT INTO notes (id, tenant_id, title, content, pinned, updated_at)"
            " OVERRIDING SYSTEM VALUE VALUES (%s, %s, 'again', 'new life', false, now())",
            (ids[2], tid),
        )
    outcome = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir)).run(
        row["id"], uuid4()
    )
    assert outcome.result == "succeeded", outcome
    notes = _artifact(settings, job(pool, row["id"]))
    assert [(n["id"], n["version"], n["content"]) for n in notes] == [(i, 2, f"{i}:2") for i in ids]


def test_a_version_nobody_kept_fails_the_job_and_renders_nothing_else(
    pool, settings: Settings
) -> None:
    tid = create_tenant(pool)
    ids = _notes(pool, tid, 2)
    row = submit(pool, settings, tid, ids)
    with pool.connection() as conn:
        _bump(conn, ids[1])
        # a violated invariant, forced by hand: the version the job names is gone
        conn.execute("DELETE FROM note_versions WHERE note_id = %s", (ids[1],))
    outcome = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir)).run(
        row["id"], uuid4()
    )
    assert (outcome.result, outcome.reason) == ("failed", "snapshot_version_missing")
    done = job(pool, row["id"])
    assert (done["status"], done["error_code"]) == ("failed", "snapshot_version_missing")
    assert done["result_ref"] is None


def _pruner_runs(pruner: VersionPruner, until: Callable[[int], bool], limit: int = 6) -> int:
    """Run the pruner until ``until(total deleted)`` or ``limit`` passes; the total."""
    total = 0
    for _ in range(limit):
        total += pruner.run_once()
        if until(total):
            break
    return total


def test_the_pruner_keeps_what_a_job_may_render_and_deletes_the_rest(
    pool, settings: Settings
) -> None:
    tid = create_tenant(pool)
    ids = _notes(pool, tid, 4)
    queued = submit(pool, settings, tid, ids[:1])
    failed = submit(pool, settings, tid, ids[1:2])
    done = submit(pool, settings, tid, ids[2:3])
    with pool.connection() as conn:
        claimed = job_store.job_claim(conn, job_id=failed["id"], message_id=None, lease_seconds=30)
        assert claimed is not None
        job_store.job_fail_if_leased(
            conn, job_id=failed["id"], lease_token=claimed.token, error_code="x", error_detail="x"
        )
        for i in ids:
            _bump(conn, i)  # version 2 of each superseded
    runner = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir))
    assert runner.run(done["id"], uuid4()).result == "succeeded"
    pruner = VersionPruner(pool, limit=100)
    assert pruner.run_once() == 0  # the first pass only marks
    assert pruner.mark is not None
    assert sorted(pruner.mark.versions) == [(ids[2], 2), (ids[3], 2)]
    assert _pruner_runs(pruner, lambda n: n >= 2) == 2
    assert _versions(pool, ids[0]) == [2] and _versions(pool, ids[1]) == [2]
    assert _versions(pool, ids[2]) == [] and _versions(pool, ids[3]) == []
    # the queued job still renders the version it named
    assert runner.run(queued["id"], uuid4()).result == "succeeded"
    assert _artifact(settings, job(pool, queued["id"]))[0]["content"] == f"{ids[0]}:2"


def test_the_pruner_waits_for_a_submit_that_read_the_version_before_it_committed(
    pool, settings: Settings, database_url: str
) -> None:
    """THE race: a submit reads version 2, the note moves to 3 and commits, the pruner
    marks version 2 (no committed job names it) — and must not sweep it until the submit's
    transaction has ended, whose reference it then sees."""
    tid = create_tenant(pool)
    [nid] = _notes(pool, tid, 1)
    pruner = VersionPruner(pool, limit=100)
    request = ExportRequest.build(ExportFormat.JSON, [nid], False)
    with transaction(pool) as conn:
        submitted = submit_in_transaction(
            conn, settings, tenant_id=tid, request=request, source="test"
        )
        with psycopg.connect(database_url, autocommit=True) as other:
            _bump(other, nid)
        assert pruner.run_once() == 0 and pruner.mark is not None
        assert pruner.mark.versions == [(nid, 2)]
        assert pruner.run_once() == 0  # the submit is still in progress: no sweep
        assert pruner.mark is not None
    assert pruner.run_once() == 0  # swept: the committed submit names it, nothing deleted
    assert _versions(pool, nid) == [2]
    runner = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir))
    assert runner.run(submitted.job["id"], uuid4()).result == "succeeded"
    assert _artifact(settings, job(pool, submitted.job["id"]))[0]["content"] == f"{nid}:2"


def test_the_pruner_sweeps_nothing_while_a_prepared_transaction_exists(
    pool, settings: Settings, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        if int(conn.execute("SHOW max_prepared_transactions").fetchone()[0]) == 0:
            pytest.skip("the test server allows no prepared transaction")
    tid = create_tenant(pool)
    [nid] = _notes(pool, tid, 1)
    with pool.connection() as conn:
        _bump(conn, nid)
    pruner = VersionPruner(pool, limit=100)
    pruner.run_once()
    gid = f"t-{uuid4().hex[:8]}"
    with psycopg.connect(database_url) as prep:
        prep.execute("SELECT 1")
        prep.execute(f"PREPARE TRANSACTION '{gid}'")
    try:
        assert pruner.run_once() == 0 and _versions(pool, nid) == [2]
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"ROLLBACK PREPARED '{gid}'")
    assert pruner.run_once() == 1


def test_the_recovery_scanner_prunes_versions_as_hygiene(pool, settings: Settings) -> None:
    tid = create_tenant(pool)
    [nid] = _notes(pool, tid, 1)
    with pool.connection() as conn:
        _bump(conn, nid)
    scanner = RecoveryScanner(settings, pool, FileArtifactStore(settings.artifact_dir))
    assert scanner.hygiene()["note_versions_pruned"] == 0  # marked
    assert scanner.hygiene()["note_versions_pruned"] == 1
    assert _versions(pool, nid) == []


# --- the race, hammered ----------------------------------------------------------------------

SUBMITS = 1000  # and as many renders
NOTES = 12


def test_every_artifact_holds_the_versions_its_submit_saw_under_concurrent_writes(
    pool, settings: Settings, database_url: str
) -> None:
    """Two connections update the same notes, one deletes and inserts them again, a pruner
    runs, while 1,000 submits and 1,000 renders go through the real submit and worker paths.
    Every note's content names its version, so each artifact proves it holds the versions
    its job recorded; every job succeeds (no version it needed was pruned)."""
    tid = create_tenant(pool)
    ids = _notes(pool, tid, NOTES)
    stop = threading.Event()
    errors: list[BaseException] = []
    pruned = [0]

    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                while not stop.is_set():
                    fn()
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
                stop.set()

        return run

    def updater(seed: int) -> Callable[[], None]:
        rng = random.Random(seed)
        conn = psycopg.connect(database_url, autocommit=True)

        def step() -> None:
            _bump(conn, rng.choice(ids))

        return step

    deleter_rng = random.Random(7)
    deleter_conn = psycopg.connect(database_url, autocommit=True)

    def delete_and_insert_again() -> None:
        nid = deleter_rng.choice(ids)
        deleter_conn.execute("DELETE FROM notes WHERE id = %s", (nid,))
        time.sleep(0.002)  # the note stays gone for a moment: submits naming it are refused
        deleter_conn.execute(
            "INSERT INTO notes (id, tenant_id, title, content, pinned, updated_at, version)"
            " OVERRIDING SYSTEM VALUE SELECT t.note_id, %s, 'again', t.note_id || ':' || (t.version + 1), false,"
            " now(), t.version + 1 FROM note_tombstones t WHERE t.note_id = %s",
            (tid, nid),
        )

    pruner = VersionPruner(pool, limit=200)

    def prune() -> None:
        pruned[0] += pruner.run_once()

    background = [
        threading.Thread(target=guarded(updater(1)), daemon=True),
        threading.Thread(target=guarded(updater(2)), daemon=True),
        threading.Thread(target=guarded(delete_and_insert_again), daemon=True),
        threading.Thread(target=guarded(prune), daemon=True),
    ]
    runner = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir))
    done: list[UUID] = []
    lock = threading.Lock()
    counter = iter(range(SUBMITS))
    stale = [0]

    def moved_on(job_id: UUID) -> bool:
        """Whether a note of the job is no longer at its recorded version (its render
        then reads the version store)."""
        with pool.connection() as conn:
            row = conn.execute(
                "SELECT count(*) AS n FROM export_job_items i"
                " LEFT JOIN notes n ON n.id = i.note_id"
                " WHERE i.job_id = %s AND NOT i.deleted AND n.version IS DISTINCT FROM i.version",
                (job_id,),
            ).fetchone()
        return bool(row and row["n"])

    def producer(seed: int) -> None:
        rng = random.Random(seed)
        pending: UUID | None = None
        try:
            while not stop.is_set():
                with lock:
                    n = next(counter, None)
                if n is None:
                    break
                while True:
                    picked = rng.sample(ids, rng.randint(1, 5))
                    try:
                        row = submit(pool, settings, tid, None if n % 50 == 0 else picked)
                        break
                    except (ExportError, SelectionChanged):
                        continue  # a note deleted right now: refused, nothing written
                if pending is not None:  # render the previous job: it waited one submit
                    if moved_on(pending):
                        with lock:
                            stale[0] += 1
                    outcome = runner.run(pending, uuid4())
                    assert outcome.result == "succeeded", outcome
                    with lock:
                        done.append(pending)
                pending = row["id"]
            if pending is not None:
                assert runner.run(pending, uuid4()).result == "succeeded"
                with lock:
                    done.append(pending)
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    for t in background:
        t.start()
    producers = [threading.Thread(target=producer, args=(s,), daemon=True) for s in (11, 12)]
    for t in producers:
        t.start()
    for t in producers:
        t.join(timeout=600)
    stop.set()
    for t in background:
        t.join(timeout=30)
    assert not errors, errors
    assert len(done) == SUBMITS
    checked = 0
    for job_id in done:
        row = job(pool, job_id)
        assert row["status"] == "succeeded", row
        with pool.connection() as conn:
            recorded = conn.execute(
                "SELECT note_id, version FROM export_job_items WHERE job_id = %s ORDER BY ordinal",
                (job_id,),
            ).fetchall()
        notes = _artifact(settings, row)
        assert [(n["id"], n["version"]) for n in notes] == [
            (r["note_id"], r["version"]) for r in recorded
        ]
        assert all(n["content"] == f"{n['id']}:{n['version']}" for n in notes), notes
        checked += len(notes)
    assert checked >= SUBMITS
    assert pruned[0] > 0  # the pruner did delete versions meanwhile
    assert stale[0] >= SUBMITS // 10, stale  # many renders read superseded versions


# --- the migration ---------------------------------------------------------------------------


def _alembic(url: str) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.attributes["database_url"] = url
    cfg.attributes["configure_logger"] = False
    return cfg


JOBS_0022 = r"""
INSERT INTO tenants (id, name) VALUES ('m', 'm');
INSERT INTO notes (id, tenant_id, title, content, pinned, updated_at)
OVERRIDING SYSTEM VALUE
VALUES (1, 'm', 'one', 'one v1', false, '2026-01-01'),
       (2, 'm', 'two', 'two v1', true, '2026-01-02'),
       (3, 'm', 'three', 'three v1', false, '2026-01-03');
INSERT INTO export_jobs (id, tenant_id, status, queue, format, payload, note_count,
                         request_hash, max_attempts, deadline_at, lease_token,
                         lease_expires_at, result_ref, result_sha256, finished_at)
SELECT ('00000000-0000-0000-0000-00000000000' || n)::uuid, 'm', s, 'exports.fast', 'json',
       '{}', 4, 'h' || n, 3, now() + interval '1 hour',
       CASE WHEN s = 'running' THEN gen_random_uuid() END,
       CASE WHEN s = 'running' THEN now() + interval '1 minute' END,
       CASE WHEN s = 'succeeded' THEN 'k' END, CASE WHEN s = 'succeeded' THEN 'x' END,
       CASE WHEN s IN ('succeeded', 'failed', 'cancelled') THEN now() END
FROM unnest(ARRAY['queued', 'running', 'succeeded', 'failed', 'cancelled'])
    WITH ORDINALITY AS t (s, n);
INSERT INTO export_job_items (job_id, ordinal, note_id, title, content, pinned, updated_at,
                              version, deleted)
SELECT j.id, x.ordinal, x.note_id, x.title, x.content, x.pinned, x.updated_at, 1, x.deleted
FROM export_jobs j
CROSS JOIN (VALUES (1, 1::bigint, 'one', 'one v1', false, '2026-01-01'::timestamptz, false),
                   (2, 2, 'two', 'two v1', true, '2026-01-02', false),
                   (3, 3, 'three', 'three v1', false, '2026-01-03', false),
                   (4, 9, '', '', false, '2026-01-09', true))
    AS x (ordinal, note_id, title, content, pinned, updated_at, deleted);
UPDATE notes SET content = 'one v2' WHERE id = 1;
DELETE FROM notes WHERE id = 2;
"""

ITEMS = (
    "SELECT job_id, ordinal, note_id, title, content, pinned, updated_at, version, deleted"
    " FROM export_job_items ORDER BY job_id, ordinal"
)


def test_the_migration_moves_snapshots_to_references_and_back(servers: Servers) -> None:
    url = servers.create_database("t_migrations_snapref")
    try:
        cfg = _alembic(url)
        command.upgrade(cfg, "0022")
        with psycopg.connect(url) as conn:
            conn.execute(JOBS_0022)
            before = conn.execute(ITEMS).fetchall()
        command.upgrade(cfg, "0023")
        with psycopg.connect(url) as conn:
            moved = conn.execute(
                "SELECT note_id, version, title, content, pinned FROM note_versions"
                " ORDER BY note_id"
            ).fetchall()
            assert moved == [(1, 1, "one", "one v1", False), (2, 1, "two", "two v1", True)]
            columns = {
                r[0]
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns"
                    " WHERE table_name = 'export_job_items'"
                )
            }
            assert columns == {"job_id", "ordinal", "note_id", "version", "deleted", "deleted_at"}
            conn.row_factory = psycopg.rows.dict_row  # type: ignore[assignment]
            for n in range(1, 6):
                job_id = UUID(f"00000000-0000-0000-0000-00000000000{n}")
                read = job_store.job_items_chunk(
                    conn,  # type: ignore[arg-type]
                    job_id=job_id,
                    after=0,
                    limit=10,
                    max_bytes=1 << 20,
                )
                old = [b for b in before if b[0] == job_id]
                assert [
                    (r["note_id"], r["title"], r["content"], r["pinned"], r["updated_at"])
                    for r in read
                ] == [(b[2], b[3], b[4], b[5], b[6]) for b in old]
                assert not any(r["missing"] for r in read)
        command.downgrade(cfg, "0022")
        with psycopg.connect(url) as conn:
            assert conn.execute(ITEMS).fetchall() == before
            assert conn.execute("SELECT to_regclass('note_versions')").fetchone() == (None,)
    finally:
        servers.drop_database("t_migrations_snapref")
