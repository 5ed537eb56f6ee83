"""What an uninterrupted render of a job's snapshot hashes to, computed from the database
(the drills and tests compare a resumed export's SHA-256 with it)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.rows import dict_row

from exportcore.domain import ExportFormat
from exportcore.manifests import Signer
from exportcore.render import ExportHeader, NoteRecord, make_renderer
from exportcore.store import jobs as job_store


class HashSink:
    """A sink that only hashes and counts what a renderer writes."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        """Hash ``data``; returns its length."""
        self.sha.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        """Bytes written so far."""
        return self.size

    def flush(self) -> None:
        """Nothing to flush."""


def reference_sha256(database_url: str, job_id: Any, signer: Signer | None = None) -> str:
    """SHA-256 (hex) of the job's snapshot rendered in one pass, chunk by chunk of 5000
    notes (:func:`snapshot_chunks`: memory stays bounded whatever the snapshot's size)."""
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        job = conn.execute("SELECT * FROM export_jobs WHERE id = %s", (job_id,)).fetchone()
        assert job is not None, f"no job {job_id}"
        sink = HashSink()
        renderer = make_renderer(ExportFormat(job["format"]), sink, signer)
        renderer.begin(ExportHeader.of_job(job))
        for rows in snapshot_chunks(conn, job_id):
            renderer.add([NoteRecord.from_row(r) for r in rows])
        renderer.end()
    return sink.sha.hexdigest()


def snapshot_chunks(conn: Any, job_id: Any, limit: int = 5000) -> Iterator[list[dict[str, Any]]]:
    """The job's snapshot, each item read at its recorded note version, in chunks of at most
    ``limit`` notes through the workers' own read (``job_items_chunk``, keyset by ordinal;
    docs/architecture.md INV-18). ``conn`` returns dict rows. Raises AssertionError on an
    item whose version is kept nowhere."""
    after = 0
    while rows := job_store.job_items_chunk(
        conn, job_id=job_id, after=after, limit=limit, max_bytes=1 << 28
    ):
        missing = [r["note_id"] for r in rows if r["missing"]]
        assert not missing, f"job {job_id}: note versions kept nowhere: {missing}"
        yield rows
        after = rows[-1]["ordinal"]
