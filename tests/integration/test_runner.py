"""JobRunner (the worker's protocol) against real PostgreSQL and the file artifact store."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from pathlib import Path
from uuid import uuid4

import pytest

from exportcore.artifacts import ArtifactWriter, FileArtifactStore
from exportcore.recovery import RecoveryScanner
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.store import jobs as job_store
from tests.support import events, job, shift_job, submit


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_run_renders_snapshot_and_publishes_one_artifact(pool, settings: Settings, tenant) -> None:
    tid, ids = tenant
    row = submit(pool, settings, tid, None)  # all notes: several chunks of 50
    runner = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir))
    outcome = runner.run(row["id"], uuid4())
    assert outcome.result == "succeeded" and outcome.attempt == 1
    done = job(pool, row["id"])
    [artifact] = _files(settings.artifact_dir)
    assert artifact.relative_to(settings.artifact_dir).as_posix() == done["result_ref"]
    assert str(done["lease_token"]) in artifact.name
    data = artifact.read_bytes()
    assert hashlib.sha256(data).hexdigest() == done["result_sha256"]
    assert len(data) == done["result_bytes"]
    doc = json.loads(data)
    with pool.connection() as conn:
        snapshot = job_store.job_items_chunk(
            conn, job_id=row["id"], after=0, limit=10_000, max_bytes=1 << 30
        )
    assert [(n["id"], n["title"], n["content"]) for n in doc["notes"]] == [
        (s["note_id"], s["title"], s["content"]) for s in snapshot
    ]
    assert doc["export"]["count"] == len(ids) == done["result_rows"]


def test_duplicate_delivery_after_success_is_refused(pool, settings: Settings, tenant) -> None:
    tid, ids = tenant
    row = submit(pool, settings, tid, ids[:3])
    runner = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir))
    message = uuid4()
    assert runner.run(row["id"], message).result == "succeeded"
    again = runner.run(row["id"], message)
    assert (again.result, again.reason) == ("refused", "terminal")
    assert job(pool, row["id"])["attempts"] == 1
    assert len(_files(settings.artifact_dir)) == 1


def test_the_message_line_tells_a_redelivery_from_a_re_execution(
    pool, settings: Settings, tenant, caplog: pytest.LogCaptureFixture
) -> None:
    """At the default level (INFO), the one line per message carries each job's result,
    attempt and lease token: a message redelivered while another worker holds the job is
    refused naming that worker's attempt and token; the job executed again after that
    worker died runs as a new attempt under a new token."""
    assert Settings().log_level == "INFO"
    caplog.set_level(logging.INFO, logger="exportcore.runner")
    tid, ids = tenant
    row = submit(pool, settings, tid, ids[:3])
    message = uuid4()
    with pool.connection() as conn:  # another worker claimed it from this message
        held = job_store.job_claim(conn, job_id=row["id"], message_id=message, lease_seconds=30)
    assert held is not None and held.attempts == 1
    runner = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir))

    def message_lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage() == "batch done"]

    redelivered = runner.run(row["id"], message)
    assert (redelivered.result, redelivered.reason) == ("refused", "leased")
    [line] = message_lines()
    assert line.levelno == logging.INFO
    assert line.runs == [  # type: ignore[attr-defined]
        {
            "job_id": str(row["id"]),
            "result": "refused",
            "attempt": 1,
            "lease_token": str(held.lease_token),
            "reason": "leased",
        }
    ]
    [refusal] = [r for r in caplog.records if r.getMessage() == "claim refused"]
    assert (refusal.attempt, refusal.lease_token) == (1, str(held.lease_token))  # type: ignore[attr-defined]

    # That worker died: its lease expires, the job is queued again and executed again.
    shift_job(pool, row["id"], lease_expires_at="-1 hour")
    RecoveryScanner(
        settings, pool, FileArtifactStore(settings.artifact_dir)
    ).recover_expired_leases()
    shift_job(pool, row["id"], next_attempt_at="-1 hour")
    again = runner.run(row["id"], uuid4())
    assert again.result == "succeeded" and again.attempt == 2
    assert again.lease_token not in (None, held.lease_token)
    assert message_lines()[-1].runs == [  # type: ignore[attr-defined]
        {
            "job_id": str(row["id"]),
            "result": "succeeded",
            "attempt": 2,
            "lease_token": str(again.lease_token),
        }
    ]


class _StealLeaseStore(FileArtifactStore):
    """The real file store, plus a fault: on the first write the job's lease expires (as if
    the worker stalled longer than its lease)."""

    def __init__(self, root: Path, pool, job_id) -> None:
        super().__init__(root)
        self.pool, self.job_id = pool, job_id

    def open_writer(self, key: str) -> ArtifactWriter:
        writer = super().open_writer(key)
        original = writer._write
        fired = []

        def write(data):  # type: ignore[no-untyped-def]
            if not fired:
                fired.append(True)
                shift_job(self.pool, self.job_id, lease_expires_at="-1 hour")
            original(data)

        writer._write = write  # type: ignore[method-assign]
        return writer


def test_lost_lease_stops_render_and_leaves_no_visible_artifact(
    pool, settings: Settings, tenant
) -> None:
    tid, _ = tenant
    row = submit(pool, settings, tid, None)
    store = _StealLeaseStore(settings.artifact_dir, pool, row["id"])
    fast_clock = itertools.count(0, 100).__next__  # 100 s pass per reading: renew every chunk
    outcome = JobRunner(settings, pool, store, clock=fast_clock).run(row["id"], uuid4())
    assert outcome.result == "lease_lost"
    assert _files(settings.artifact_dir) == []  # the temp file was removed, nothing published
    current = job(pool, row["id"])
    assert current["status"] == "running" and current["result_ref"] is None
    assert "succeeded" not in [e["kind"] for e in events(pool, row["id"])]


def test_not_due_message_is_refused_without_consuming_an_attempt(
    pool, settings: Settings, tenant
) -> None:
    tid, ids = tenant
    row = submit(pool, settings, tid, ids[:1])
    shift_job(pool, row["id"], next_attempt_at="+10 minutes")
    outcome = JobRunner(settings, pool, FileArtifactStore(settings.artifact_dir)).run(
        row["id"], uuid4()
    )
    assert (outcome.result, outcome.reason) == ("refused", "not_due")
    assert job(pool, row["id"])["attempts"] == 0


def test_chunks_are_bounded_in_bytes_as_well_as_in_notes(pool, settings: Settings, tenant) -> None:
    """Big notes: a chunk holds as many as fit in RENDER_CHUNK_BYTES (at least one), and the
    export is still complete and in order."""
    tid, ids = tenant
    row = submit(pool, settings, tid, ids[:40])
    with pool.connection() as conn:
        sizes = [
            len(r["title"].encode()) + len(r["content"].encode())
            for r in job_store.job_items_chunk(
                conn, job_id=row["id"], after=0, limit=10_000, max_bytes=1 << 30
            )
        ]
        budget = max(sizes) * 2
        chunks = []
        after = 0
        while True:
            chunk = job_store.job_items_chunk(
                conn, job_id=row["id"], after=after, limit=50, max_bytes=budget
            )
            if not chunk:
                break
            chunks.append([c["ordinal"] for c in chunk])
            assert len(chunk) == 1 or sum(sizes[o - 1] for o in chunks[-1]) <= budget
            after = chunk[-1]["ordinal"]
    assert [o for c in chunks for o in c] == list(range(1, 41))
    assert len(chunks) > 1
    small = settings.model_copy(update={"render_chunk_bytes": budget})
    outcome = JobRunner(small, pool, FileArtifactStore(settings.artifact_dir)).run(
        row["id"], uuid4()
    )
    assert outcome.result == "succeeded"
    doc = json.loads((settings.artifact_dir / job(pool, row["id"])["result_ref"]).read_bytes())
    assert [n["id"] for n in doc["notes"]] == sorted(ids[:40])
