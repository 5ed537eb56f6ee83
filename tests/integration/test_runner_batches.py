"""A worker's batch (several small jobs of one message) against real PostgreSQL and the file
store: claimed together, finished together, and one job's failure, lost lease or cancel
never touching its neighbours."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path
from uuid import UUID, uuid4

from exportcore.artifacts import ArtifactWriter, FileArtifactStore, StoredArtifact
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from tests.support import count, events, job, submit


def small_jobs(pool, settings: Settings, tenant, n: int) -> list[UUID]:
    tid, ids = tenant
    return [submit(pool, settings, tid, ids[i : i + 3])["id"] for i in range(n)]


def deliveries(job_ids: Sequence[UUID]) -> list[tuple[UUID, UUID]]:
    return [(job_id, uuid4()) for job_id in job_ids]


def published_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".tmp"))


def test_a_batch_is_claimed_and_finished_in_one_statement_each(pool, settings, tenant) -> None:
    jobs = small_jobs(pool, settings, tenant, 5)
    runner = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir))
    outcomes = runner.run_batch(deliveries(jobs))
    assert [o.result for o in outcomes] == ["succeeded"] * 5
    assert [o.job_id for o in outcomes] == jobs
    rows = [job(pool, j) for j in jobs]
    # now() is the statement's transaction time: one claim, one finish for the five
    assert len({r["started_at"] for r in rows}) == 1
    assert len({r["finished_at"] for r in rows}) == 1
    assert sorted(
        p.relative_to(settings.artifact_dir).as_posix()
        for p in published_files(settings.artifact_dir)
    ) == sorted(r["result_ref"] for r in rows)
    for r in rows:
        kinds = [e["kind"] for e in events(pool, r["id"])]
        assert kinds == ["submitted", "claimed", "succeeded"]


def test_refused_jobs_of_a_batch_do_not_stop_the_others(pool, settings, tenant) -> None:
    jobs = small_jobs(pool, settings, tenant, 3)
    runner = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir))
    assert runner.run(jobs[1], uuid4()).result == "succeeded"  # a duplicate delivery later
    outcomes = runner.run_batch(deliveries([jobs[0], jobs[1], uuid4(), jobs[2]]))
    assert [o.result for o in outcomes] == ["succeeded", "refused", "refused", "succeeded"]
    assert [o.reason for o in outcomes[1:3]] == ["terminal", "not_found"]
    assert job(pool, jobs[1])["attempts"] == 1


class _FailOneStore(FileArtifactStore):
    """Writes of one job fail with EIO (a transient storage error) at commit."""

    def __init__(self, root: Path, victim: UUID) -> None:
        super().__init__(root)
        self.victim = victim

    def commit_all(self, writers: Sequence[ArtifactWriter]) -> list[StoredArtifact | Exception]:
        mine = [w for w in writers if str(self.victim) in w.key]
        for w in mine:
            w.abort()
        rest = super().commit_all([w for w in writers if w not in mine])
        it = iter(rest)
        return [OSError(errno.EIO, "injected") if w in mine else next(it) for w in writers]


def test_one_failing_job_is_retried_alone(pool, settings, tenant) -> None:
    jobs = small_jobs(pool, settings, tenant, 4)
    store = _FailOneStore(settings.artifact_dir, jobs[2])
    outcomes = JobRunner(settings, pool, store).run_batch(deliveries(jobs))
    assert [o.result for o in outcomes] == ["succeeded", "succeeded", "retry", "succeeded"]
    failed = job(pool, jobs[2])
    assert (failed["status"], failed["attempts"], failed["result_ref"]) == ("queued", 1, None)
    assert (
        count(
            pool,
            "SELECT count(*) FROM export_outbox WHERE job_id = %s AND reason = 'retry'",
            jobs[2],
        )
        == 1
    )
    assert not any(str(jobs[2]) in p.as_posix() for p in published_files(settings.artifact_dir))


class _StaleOneStore(FileArtifactStore):
    """Between the render and the finish of a batch, recovery takes one job's lease away
    (its lease expired and a new holder claimed it): that job's finish is stale."""

    def __init__(self, root: Path, pool, victim: UUID) -> None:
        super().__init__(root)
        self.pool = pool
        self.victim = victim

    def commit_all(self, writers: Sequence[ArtifactWriter]) -> list[StoredArtifact | Exception]:
        results = super().commit_all(writers)
        with self.pool.connection() as conn:
            conn.execute(
                "UPDATE export_jobs SET lease_token = gen_random_uuid(),"
                " lease_expires_at = now() + interval '1 minute' WHERE id = %s",
                (self.victim,),
            )
        return results


def test_a_stale_finish_inside_a_batch_publishes_nothing_for_that_job(
    pool, settings, tenant
) -> None:
    jobs = small_jobs(pool, settings, tenant, 3)
    store = _StaleOneStore(settings.artifact_dir, pool, jobs[1])
    outcomes = JobRunner(settings, pool, store).run_batch(deliveries(jobs))
    assert [o.result for o in outcomes] == ["succeeded", "finish_refused", "succeeded"]
    stale = job(pool, jobs[1])
    assert stale["status"] == "running" and stale["result_ref"] is None
    assert "succeeded" not in [e["kind"] for e in events(pool, jobs[1])]
    # the stale artifact was deleted; the neighbours' artifacts are published
    assert not any(str(jobs[1]) in p.as_posix() for p in published_files(settings.artifact_dir))
    assert len(published_files(settings.artifact_dir)) == 2


class _CancelOneStore(FileArtifactStore):
    """While the batch renders, the tenant cancels one of its jobs."""

    def __init__(self, root: Path, pool, victim: UUID, tenant_id: str) -> None:
        super().__init__(root)
        self.pool, self.victim, self.tenant_id = pool, victim, tenant_id

    def open_writer(self, key: str) -> ArtifactWriter:
        if str(self.victim) in key:
            from exportcore.cancel import request_cancel

            request_cancel(self.pool, tenant_id=self.tenant_id, job_id=self.victim)
        return super().open_writer(key)


def test_a_cancel_of_one_job_of_a_batch_cancels_that_job_only(pool, settings, tenant) -> None:
    jobs = small_jobs(pool, settings, tenant, 3)
    store = _CancelOneStore(settings.artifact_dir, pool, jobs[0], tenant[0])
    outcomes = JobRunner(settings, pool, store).run_batch(deliveries(jobs))
    assert [o.result for o in outcomes] == ["cancelled", "succeeded", "succeeded"]
    assert job(pool, jobs[0])["status"] == "cancelled"
    assert [e["kind"] for e in events(pool, jobs[0])][-2:] == ["cancel_requested", "cancelled"]
    assert not any(str(jobs[0]) in p.as_posix() for p in published_files(settings.artifact_dir))


def test_a_batch_commits_what_it_rendered_when_the_flush_time_has_passed(
    pool, settings, tenant
) -> None:
    """With WORKER_BATCH_FLUSH_SECONDS = 0 every rendered job is finished on its own, so a
    slow neighbour later in the batch never delays its result."""
    jobs = small_jobs(pool, settings, tenant, 3)
    eager = settings.model_copy(update={"worker_batch_flush_seconds": 0.0})
    outcomes = JobRunner(eager, pool, FileArtifactStore(settings.artifact_dir)).run_batch(
        deliveries(jobs)
    )
    assert [o.result for o in outcomes] == ["succeeded"] * 3
    rows = [job(pool, j) for j in jobs]
    assert len({r["started_at"] for r in rows}) == 1  # claimed together
    assert len({r["finished_at"] for r in rows}) == 3  # finished one by one
