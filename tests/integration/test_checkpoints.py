"""Resumable bulk renders (exportcore.checkpoints) on real PostgreSQL, on the file store and
on a real S3-compatible server: a render that loses its lease mid-way is taken over by the
next claim from its checkpoint, byte-identical (same SHA-256) and rendering each note once
more at most for the chunks after the last checkpoint; the old holder is fenced out; an
untrustworthy checkpoint (its prefix short or gone, another layout, segments that do not
rebuild the renderer) is discarded, counted by reason, and the export starts over; the
status (API and ``exportctl status``) shows the checkpoint and the notes a takeover carried
over."""

from __future__ import annotations

import io
import zlib
from typing import Any
from uuid import uuid4

import pytest
from pydantic import SecretStr
from rich.console import Console

from devtools import render_check
from exportcore import checkpoints, metrics
from exportcore.artifacts import open_store
from exportcore.render import NoteRecord
from exportcore.runner import JobRunner
from exportcore.settings import Settings
from exportcore.store import checkpoints as cp_store
from exportctl.exports import _status_table
from tests.support import events, job, multiply_notes, shift_job, submit

MiB = 1024 * 1024


def reference_sha256(pool: Any, settings: Settings, job_id: Any) -> str:
    """What an uninterrupted render of the job's snapshot hashes to."""
    return render_check.reference_sha256(
        str(settings.database_url), job_id, settings.manifest_signer()
    )


class Rendered:
    """Counts the notes the runner renders (every snapshot row it turns into a record) and
    can make the lease expire once ``lose_after`` notes were rendered, as a kill would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, pool: Any) -> None:
        self.count = 0
        self.lose_after: int | None = None
        self.job_id: Any = None
        original = NoteRecord.from_row

        def from_row(row: dict[str, Any]) -> NoteRecord:
            self.count += 1
            if self.lose_after is not None and self.count == self.lose_after:
                shift_job(pool, self.job_id, lease_expires_at="-1 hour")
            return original(row)

        monkeypatch.setattr("exportcore.runner.NoteRecord.from_row", staticmethod(from_row))


def _bulk_export(pool: Any, settings: Settings, tenant: tuple[str, list[int]], size: int) -> Any:
    tid, _ = tenant
    with pool.connection() as conn:
        multiply_notes(conn, tid, size)
    row = submit(pool, settings, tid, None, fmt="ndjson")
    assert row["queue"] == "exports.bulk"
    return row


def _requeue_after_expiry(pool: Any, settings: Settings, job_id: Any) -> None:
    """What the recovery-scanner does to an expired lease, due at once."""
    from exportcore.recovery import RecoveryScanner

    scanner = RecoveryScanner(settings, pool, open_store(settings))
    scanner.recover_expired_leases()
    shift_job(pool, job_id, next_attempt_at="-1 hour")
    assert job(pool, job_id)["status"] == "queued"


def _counter(metric: Any, *labels: str) -> float:
    child = metric.labels(*labels) if labels else metric
    return float(child._value.get())


@pytest.fixture(params=["file", "s3"])
def bulk_settings(request: pytest.FixtureRequest) -> Settings:
    """Settings with checkpoints every 256 KiB on the file store, every part (5 MiB, the
    S3 minimum) on S3, and a signing key."""
    from exportcore.manifests import new_private_key_text

    base: Settings = request.getfixturevalue(
        "settings" if request.param == "file" else "s3_settings"
    )
    return base.model_copy(
        update={
            "checkpoint_bytes": 256 * 1024 if request.param == "file" else 1,
            "manifest_signing_key": SecretStr(new_private_key_text()[0]),
        }
    )


def test_a_render_that_loses_its_lease_resumes_byte_identical(
    pool, bulk_settings: Settings, tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = bulk_settings
    size = 2 * MiB if settings.artifact_location().scheme == "file" else 16 * MiB
    row = _bulk_export(pool, settings, tenant, size)
    total = row["note_count"]
    store = open_store(settings)
    rendered = Rendered(monkeypatch, pool)
    rendered.job_id, rendered.lose_after = row["id"], int(total * 0.6)
    resumed_before = _counter(metrics.CHECKPOINTS_RESUMED, store.backend)

    first = JobRunner(settings, pool, store).run(row["id"], uuid4())
    assert first.result == "lease_lost"
    first_rendered = rendered.count
    with pool.connection() as conn:
        ckpt = cp_store.checkpoint_get(conn, job_id=row["id"])
    assert ckpt is not None and ckpt["lease_token"] == first.lease_token
    assert 0 < ckpt["rows"] < total
    # The checkpointed prefix is kept for the next claimer (not aborted with the attempt).
    kept = {e.key: e.complete for e in store.entries(row["tenant_id"], row["id"])}
    assert kept == {ckpt["artifact_key"]: False}

    _requeue_after_expiry(pool, settings, row["id"])
    rendered.lose_after, rendered.count = None, 0
    second = JobRunner(settings, pool, store).run(row["id"], uuid4())
    assert second.result == "succeeded", second
    # Rendered once more: only what came after the checkpoint.
    assert rendered.count == total - ckpt["rows"]
    # What was rendered twice is what the first attempt did after its last checkpoint (at
    # most a checkpoint's worth of bytes; the 1.1x bound on a 200,000-note export is the
    # bulk_resume drills').
    assert first_rendered >= ckpt["rows"]
    done = job(pool, row["id"])
    assert done["result_sha256"] == reference_sha256(pool, settings, row["id"])
    [resumed] = [e for e in events(pool, row["id"]) if e["kind"] == "resumed"]
    assert resumed["detail"]["notes"] == ckpt["rows"]
    assert resumed["lease_token"] == second.lease_token
    assert _counter(metrics.CHECKPOINTS_RESUMED, store.backend) == resumed_before + 1
    # Nothing of the first attempt is left, and the checkpoint is gone with the success.
    assert [e.key for e in store.entries(row["tenant_id"], row["id"])] == [done["result_ref"]]
    with pool.connection() as conn:
        assert cp_store.checkpoint_get(conn, job_id=row["id"]) is None
        # Fenced: the first holder can neither move nor take the checkpoint any more.
        assert (
            cp_store.checkpoint_save(
                conn,
                job_id=row["id"],
                lease_token=first.lease_token,
                layout=2,
                artifact_key=ckpt["artifact_key"],
                ordinal=ckpt["ordinal"] + 1,
                rows=ckpt["rows"] + 1,
                nbytes=ckpt["bytes"] + 1,
                sha256="0" * 64,
                upload_id=None,
                parts=[],
                renderer={},
                state=b"",
            )
            is None
        )


def test_an_untrustworthy_checkpoint_is_discarded_and_the_export_starts_over(
    pool, settings: Settings, tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings.model_copy(update={"checkpoint_bytes": 256 * 1024})
    row, store, rendered, ckpt = _lost_checkpoint(pool, settings, tenant, monkeypatch, 2 * MiB)
    # The temporary file loses its last byte (a disk that lost a write).
    tmp = settings.artifact_dir / (ckpt["artifact_key"] + ".tmp")
    with open(tmp, "r+b") as fh:
        fh.truncate(ckpt["bytes"] - 1)

    _starts_over(pool, settings, row, store, rendered, "short")
    assert not tmp.exists()


def test_the_status_shows_the_checkpoint_and_the_notes_carried_over(
    pool, settings: Settings, tenant, api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GET /v1/exports/{id} of a bulk export that lost its lease twice shows its checkpoint:
    the notes and bytes made durable, the takeovers, and the notes the latest takeover
    carried over instead of rendering them again; none once it succeeded."""
    client, user, _ = api
    settings = settings.model_copy(update={"checkpoint_bytes": 256 * 1024})
    row = _bulk_export(pool, settings, tenant, 2 * MiB)
    store = open_store(settings)
    rendered = Rendered(monkeypatch, pool)

    def lose_after(notes: int) -> Any:
        rendered.job_id, rendered.lose_after, rendered.count = row["id"], notes, 0
        assert JobRunner(settings, pool, store).run(row["id"], uuid4()).result == "lease_lost"
        with pool.connection() as conn:
            ckpt = cp_store.checkpoint_get(conn, job_id=row["id"])
        _requeue_after_expiry(pool, settings, row["id"])
        return ckpt

    def status() -> dict[str, Any]:
        r = client.get(f"/v1/exports/{row['id']}", headers=user)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def shown() -> Any:
        return status()["checkpoint"]

    first = lose_after(row["note_count"] // 2)
    assert 0 < first["rows"] < row["note_count"]
    assert {k: v for k, v in shown().items() if k != "at"} == {
        "notes": first["rows"],
        "bytes": first["bytes"],
        "resumes": 0,
        "notes_carried_over": 0,
    }
    second = lose_after((row["note_count"] - first["rows"]) // 2)  # after a takeover
    assert first["rows"] < second["rows"] < row["note_count"]
    assert {k: v for k, v in shown().items() if k != "at"} == {
        "notes": second["rows"],
        "bytes": second["bytes"],
        "resumes": 1,
        "notes_carried_over": first["rows"],
    }
    text = io.StringIO()  # exportctl status prints it
    Console(file=text, width=200).print(_status_table(status()))
    assert (
        f"{second['rows']} notes, {second['bytes']} bytes durable; resumes 1, "
        f"notes carried over {first['rows']}"
    ) in text.getvalue()

    rendered.lose_after = None
    assert JobRunner(settings, pool, store).run(row["id"], uuid4()).result == "succeeded"
    assert shown() is None  # the checkpoint is gone with the success
    done = job(pool, row["id"])
    assert done["result_sha256"] == reference_sha256(pool, settings, row["id"])


def _lost_checkpoint(
    pool: Any, settings: Settings, tenant: Any, monkeypatch: pytest.MonkeyPatch, size: int
) -> tuple[Any, Any, Rendered, Any]:
    """A bulk export of about ``size`` bytes whose first attempt lost its lease at 60 % of
    its notes, leaving a checkpoint: (job row, store, rendered counter, checkpoint)."""
    row = _bulk_export(pool, settings, tenant, size)
    store = open_store(settings)
    rendered = Rendered(monkeypatch, pool)
    rendered.job_id, rendered.lose_after = row["id"], int(row["note_count"] * 0.6)
    assert JobRunner(settings, pool, store).run(row["id"], uuid4()).result == "lease_lost"
    with pool.connection() as conn:
        ckpt = cp_store.checkpoint_get(conn, job_id=row["id"])
    assert ckpt is not None and 0 < ckpt["rows"] < row["note_count"]
    return row, store, rendered, ckpt


def _lost_s3_checkpoint(
    pool: Any, s3_settings: Settings, tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[Settings, Any, Any, Rendered, Any]:
    """A 16 MiB bulk export on S3, checkpointing every part, whose first attempt lost its
    lease at 60 % of its notes: (settings, job row, store, rendered counter, checkpoint)."""
    settings = s3_settings.model_copy(update={"checkpoint_bytes": 1})
    row, store, rendered, ckpt = _lost_checkpoint(pool, settings, tenant, monkeypatch, 16 * MiB)
    assert ckpt["upload_id"]
    return settings, row, store, rendered, ckpt


def _starts_over(
    pool: Any, settings: Settings, row: Any, store: Any, rendered: Rendered, reason: str
) -> Any:
    """Run the next claim of ``row`` (its lease expired and recovered): it must discard the
    checkpoint for ``reason`` (``exports_checkpoints_discarded_total{reason}`` + 1), render
    every note again (no ``resumed`` event), leave nothing but its artifact in the store and
    no checkpoint, and hash as an uninterrupted run. Returns the finished job row."""
    discarded = _counter(metrics.CHECKPOINTS_DISCARDED, reason)
    _requeue_after_expiry(pool, settings, row["id"])
    rendered.lose_after, rendered.count = None, 0
    outcome = JobRunner(settings, pool, store).run(row["id"], uuid4())
    assert outcome.result == "succeeded", outcome
    assert rendered.count == row["note_count"]  # started over
    assert _counter(metrics.CHECKPOINTS_DISCARDED, reason) == discarded + 1
    assert "resumed" not in [e["kind"] for e in events(pool, row["id"])]
    done = job(pool, row["id"])
    assert done["result_sha256"] == reference_sha256(pool, settings, row["id"])
    assert [e.key for e in store.entries(row["tenant_id"], row["id"])] == [done["result_ref"]]
    with pool.connection() as conn:
        assert cp_store.checkpoint_get(conn, job_id=row["id"]) is None
    return done


def test_a_takeover_that_died_after_freezing_the_upload_is_taken_over_again(
    pool, s3_settings: Settings, tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On S3 a takeover first completes the old upload (freezing it); one that died right
    after leaves the prefix as an object, which the next takeover still trusts once its
    SHA-256 is the recorded one."""
    settings, row, store, rendered, ckpt = _lost_s3_checkpoint(
        pool, s3_settings, tenant, monkeypatch
    )
    store.client().complete_multipart_upload(  # what the dead takeover had done
        Bucket=store.config.bucket,
        Key=store.object_key(ckpt["artifact_key"]),
        UploadId=ckpt["upload_id"],
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e, _ in ckpt["parts"]]},
    )
    _requeue_after_expiry(pool, settings, row["id"])
    rendered.lose_after, rendered.count = None, 0
    assert JobRunner(settings, pool, store).run(row["id"], uuid4()).result == "succeeded"
    assert rendered.count == row["note_count"] - ckpt["rows"]
    assert "resumed" in [e["kind"] for e in events(pool, row["id"])]
    done = job(pool, row["id"])
    assert done["result_sha256"] == reference_sha256(pool, settings, row["id"])
    assert [e.key for e in store.entries(row["tenant_id"], row["id"])] == [done["result_ref"]]


def test_a_checkpointed_upload_a_stale_holder_completed_and_deleted_is_started_over(
    pool, s3_settings: Settings, tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen holder that thaws before its clock sees the lease end passes its last check,
    completes its upload and, its finish refused, deletes the object. The checkpoint still
    names that upload; some stores (moto) answer its completion with a 500, not
    NoSuchUpload. The takeover asks whether the upload is still in progress, finds it gone,
    discards the checkpoint and starts over instead of retrying until attempts run out."""
    settings, row, store, rendered, ckpt = _lost_s3_checkpoint(
        pool, s3_settings, tenant, monkeypatch
    )
    client, bucket = store.client(), store.config.bucket
    old = store.object_key(ckpt["artifact_key"])
    client.complete_multipart_upload(  # what the stale holder's commit did
        Bucket=bucket,
        Key=old,
        UploadId=ckpt["upload_id"],
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e, _ in ckpt["parts"]]},
    )
    client.delete_object(Bucket=bucket, Key=old)  # and its refused finish's cleanup

    _starts_over(pool, settings, row, store, rendered, "missing")
    uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["Key"] for u in uploads if str(row["id"]) in u["Key"]] == []


def test_a_checkpoint_of_another_layout_is_discarded_and_the_export_starts_over(
    pool, bulk_settings: Settings, tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade that changed the byte layout of the renderers or writers (a new
    ``checkpoints.LAYOUT``) meets a checkpoint an older version took: its prefix was written
    in the old layout, so it is discarded (reason ``layout``) with its temporary file or
    multipart upload, and the export starts over, byte-identical to an uninterrupted run."""
    settings = bulk_settings
    s3 = settings.artifact_location().scheme != "file"
    row, store, rendered, ckpt = _lost_checkpoint(
        pool, settings, tenant, monkeypatch, 16 * MiB if s3 else 2 * MiB
    )
    assert ckpt["layout"] == checkpoints.LAYOUT
    monkeypatch.setattr(checkpoints, "LAYOUT", checkpoints.LAYOUT + 1)  # the upgrade

    _starts_over(pool, settings, row, store, rendered, "layout")
    if s3:  # the old multipart upload is aborted, not left to the orphan cleanup
        uploads = store.client().list_multipart_uploads(Bucket=store.config.bucket)
        assert [u["Key"] for u in uploads.get("Uploads", []) if str(row["id"]) in u["Key"]] == []
    else:
        assert not (settings.artifact_dir / (ckpt["artifact_key"] + ".tmp")).exists()


def _drop_first_segment(conn: Any, job_id: Any) -> None:
    conn.execute(
        "DELETE FROM export_checkpoint_segments WHERE job_id = %s AND ordinal ="
        " (SELECT min(ordinal) FROM export_checkpoint_segments WHERE job_id = %s)",
        (job_id, job_id),
    )


def _set_first_segment(state: bytes) -> Any:
    def change(conn: Any, job_id: Any) -> None:
        conn.execute(
            "UPDATE export_checkpoint_segments SET state = %s WHERE job_id = %s AND ordinal ="
            " (SELECT min(ordinal) FROM export_checkpoint_segments WHERE job_id = %s)",
            (state, job_id, job_id),
        )

    return change


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_drop_first_segment, id="a segment missing"),
        pytest.param(_set_first_segment(b"not zlib at all"), id="an unreadable segment"),
        pytest.param(  # what a changed segment format without a new LAYOUT would leave
            _set_first_segment(zlib.compress(b'{"notes": []}')), id="a segment of another shape"
        ),
    ],
)
def test_a_checkpoint_whose_segments_do_not_rebuild_the_renderer_is_discarded(
    pool, settings: Settings, tenant, monkeypatch: pytest.MonkeyPatch, damage: Any
) -> None:
    """The renderer state of a checkpoint (its segments: manifest entries, zip entries)
    must rebuild a renderer that rendered exactly the checkpoint's notes; a segment that is
    gone, cannot be read, or reads as JSON of another shape makes the checkpoint
    untrustworthy even though its prefix is intact: discarded (reason ``segments``, the
    prefix dropped) and started over, byte-identical to an uninterrupted run, rather than
    failing every attempt the same way."""
    settings = settings.model_copy(update={"checkpoint_bytes": 256 * 1024})
    row, store, rendered, ckpt = _lost_checkpoint(pool, settings, tenant, monkeypatch, 2 * MiB)
    with pool.connection() as conn:
        assert cp_store.checkpoint_segments(conn, job_id=row["id"], ordinal=ckpt["ordinal"])
        damage(conn, row["id"])

    _starts_over(pool, settings, row, store, rendered, "segments")
    assert not (settings.artifact_dir / (ckpt["artifact_key"] + ".tmp")).exists()
