"""Checkpoints of bulk renders: a killed or evicted bulk export goes on where it stopped.

While a bulk export renders, every chunk boundary where the artifact store made the bytes
written so far durable (the file backend's fsync of the token's temporary file every
``CHECKPOINT_BYTES``; an S3 part of at least ``S3_MULTIPART_PART_SIZE``) is recorded under
the lease token (``checkpoint_save``): the keyset cursor, the notes and bytes of that
prefix, its SHA-256, the upload id and the parts' ETags, and the renderer state added since
the previous checkpoint (a segment: manifest entries, zip entries).

The next claimer (its own new token) takes it over (:meth:`Checkpointer.open`): the store
copies the durable prefix under the new token's key, re-hashing it against the recorded
SHA-256 (hashlib cannot export a hash state; re-hashing costs one sequential read of the
prefix and checks it), the renderer is rebuilt from the segments, the row becomes the new
token's (``checkpoint_take_over``, a ``resumed`` event) and rendering goes on after the
cursor. The result is byte-identical to an uninterrupted run. A checkpoint that cannot be
trusted (layout changed, segments missing, file or upload gone, prefix shorter or hashing
differently) is discarded (``exports_checkpoints_discarded_total{reason}``) and the export
starts over. Invariants under fencing: docs/architecture.md "Checkpoints".
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from psycopg_pool import ConnectionPool

from exportcore import metrics as m
from exportcore.artifacts import (
    ArtifactStore,
    ArtifactWriter,
    CheckpointUntrusted,
    DurablePrefix,
)
from exportcore.db import Conn, Row
from exportcore.lease_renewal import LeaseLost
from exportcore.render import ExportHeader, Renderer
from exportcore.store import checkpoints as store
from exportcore.store.jobs import JobRow

log = logging.getLogger(__name__)

LAYOUT = 2
"""The byte layout of renderers and writers a checkpoint was taken with; a checkpoint of
another layout (an upgrade changed a format) is discarded."""


@dataclass
class Opened:
    """What a render starts from: the writer (holding the carried prefix, if any), the
    renderer (begun, or resumed), and the snapshot cursor to read after."""

    writer: ArtifactWriter
    renderer: Renderer
    after: int
    carried: int


class Checkpointer:
    """Checkpoints of one bulk render under one lease token.

    ``min_bytes``: the least bytes between two checkpoints (``CHECKPOINT_BYTES``).
    """

    def __init__(
        self,
        pool: ConnectionPool[Conn],
        store_: ArtifactStore,
        job: JobRow,
        min_bytes: int,
    ) -> None:
        self.pool = pool
        self.store = store_
        self.job = job
        self.min_bytes = min_bytes
        self.saved = 0
        self.held = False
        """True once this token holds a checkpoint (saved one, or took one over)."""

    # --- start -----------------------------------------------------------------------------

    def open(self, key: str, make: Any, header: ExportHeader) -> Opened:
        """Start the render: take over the job's checkpoint when there is one and it can be
        trusted, else start over (discarding it). ``make(sink)`` builds a renderer.
        Raises ``LeaseLost`` when the lease is lost meanwhile."""
        with self.pool.connection() as conn:
            row = store.checkpoint_get(conn, job_id=self.job.id)
            segments = (
                store.checkpoint_segments(conn, job_id=self.job.id, ordinal=row["ordinal"])
                if row is not None and row["lease_token"] != self.job.token
                else []
            )
        if row is not None:
            try:
                return self._take_over(row, segments, key, make, header)
            except CheckpointUntrusted as exc:
                self._discard(row, exc.reason, str(exc))
        writer = self.store.open_writer(key)
        try:
            renderer = make(writer)
            renderer.begin(header)
        except BaseException:
            writer.abort()
            raise
        return Opened(writer, renderer, 0, 0)

    def discard_any(self, reason: str, detail: str) -> None:
        """Discard the job's checkpoint, if it has one, and its durable prefix, without
        taking it over: an encrypted render (:mod:`exportcore.encryption`) never resumes,
        and a plain prefix left by an earlier attempt (the tenant's recipients were set
        since) must not stay in the store. ``reason``: the metric label. Raises
        ``LeaseLost`` when the lease is lost meanwhile."""
        with self.pool.connection() as conn:
            row = store.checkpoint_get(conn, job_id=self.job.id)
        if row is not None:
            self._discard(row, reason, detail)

    def _take_over(
        self, row: Row, segments: list[bytes], key: str, make: Any, header: ExportHeader
    ) -> Opened:
        if row["lease_token"] == self.job.token:  # never: a claim always has a new token
            raise CheckpointUntrusted("layout", "the checkpoint is this lease's own")
        if row["layout"] != LAYOUT:
            raise CheckpointUntrusted("layout", f"layout {row['layout']}, not {LAYOUT}")
        old = _prefix(row)
        if old.key.rsplit("/", 1)[0] != key.rsplit("/", 1)[0]:
            raise CheckpointUntrusted("layout", "the checkpoint names another job's key")
        started = time.monotonic()
        writer, durable = self.store.resume_writer(key, old)
        try:
            renderer = make(writer)
            try:
                renderer.resume(header, segments)
            except ValueError as exc:
                raise CheckpointUntrusted("segments", str(exc)) from None
            if renderer.rows != row["rows"]:
                raise CheckpointUntrusted(
                    "segments", f"segments hold {renderer.rows} notes, not {row['rows']}"
                )
            with self.pool.connection() as conn:
                taken = store.checkpoint_take_over(
                    conn,
                    job_id=self.job.id,
                    lease_token=self.job.token,
                    old_token=row["lease_token"],
                    ordinal=row["ordinal"],
                    artifact_key=key,
                    upload_id=durable.upload_id,
                    parts=durable.parts,
                    seconds=round(time.monotonic() - started, 3),
                )
            if taken is None:
                raise LeaseLost(f"lease {self.job.token} lost while taking over a checkpoint")
        except BaseException:
            writer.abort()
            raise
        writer.retain = True
        self.held = True
        self.store.drop_prefix(old)
        m.CHECKPOINTS_RESUMED.labels(self.store.backend).inc()
        m.NOTES_CARRIED.inc(row["rows"])
        log.info(
            "checkpoint taken over",
            extra={
                "job_id": str(self.job.id),
                "lease_token": str(self.job.token),
                "notes": row["rows"],
                "bytes": row["bytes"],
                "resumes": taken["resumes"],
                "seconds": round(time.monotonic() - started, 3),
            },
        )
        return Opened(writer, renderer, row["ordinal"], row["rows"])

    def _discard(self, row: Row, reason: str, detail: str) -> None:
        m.CHECKPOINTS_DISCARDED.labels(reason).inc()
        log.warning(
            "checkpoint discarded; the export starts over",
            extra={"job_id": str(self.job.id), "reason": reason, "detail": detail},
        )
        with self.pool.connection() as conn:
            dropped = store.checkpoint_discard(conn, job_id=self.job.id, lease_token=self.job.token)
        if dropped is None:
            raise LeaseLost(f"lease {self.job.token} lost while discarding a checkpoint")
        self.store.drop_prefix(_prefix(row))

    # --- while rendering -------------------------------------------------------------------

    def after_chunk(self, writer: ArtifactWriter, renderer: Renderer, ordinal: int) -> bool:
        """At a chunk boundary (the last note rendered has ``ordinal``): when the store
        made a new prefix durable, record it; True when a checkpoint was saved. Raises
        ``LeaseLost`` when refused."""
        prefix = writer.sync(self.min_bytes)
        if prefix is None:
            return False
        state = renderer.checkpoint_state()
        with self.pool.connection() as conn:
            saved = store.checkpoint_save(
                conn,
                job_id=self.job.id,
                lease_token=self.job.token,
                layout=LAYOUT,
                artifact_key=prefix.key,
                ordinal=ordinal,
                rows=renderer.rows,
                nbytes=prefix.nbytes,
                sha256=prefix.sha256,
                upload_id=prefix.upload_id,
                parts=prefix.parts,
                renderer={"format": self.job.format},
                state=state,
            )
        if saved is None:
            raise LeaseLost(f"lease {self.job.token} of job {self.job.id} refused a checkpoint")
        renderer.checkpoint_saved()
        writer.retain = True
        self.saved += 1
        self.held = True
        return True

    def finished(self) -> None:
        """The job succeeded under this token: its checkpoint is no longer needed."""
        with self.pool.connection() as conn:
            store.checkpoint_delete_finished(conn, job_id=self.job.id, lease_token=self.job.token)


def _prefix(row: Row) -> DurablePrefix:
    return DurablePrefix(
        key=row["artifact_key"],
        nbytes=int(row["bytes"]),
        sha256=row["sha256"],
        upload_id=row["upload_id"],
        parts=tuple((int(n), str(etag), int(size)) for n, etag, size in row["parts"]),
    )
