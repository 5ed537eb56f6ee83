"""The job every peer runs: read 5 notes from PostgreSQL, render them with exportcore's JSON
renderer, write the file with exportcore's artifact writer (temp file, fsync, atomic
rename, fsync of the folder). notes-exports runs the same steps inside its JobRunner (reading
the job's snapshot of the same notes).

Each peer's task calls :func:`run_job` and then :func:`record`, which appends one line
``key t_enqueued t_started t_finished`` (wall clock seconds) to a per-process file: the
harness counts lines for throughput and reads latencies from them (peers have no common
database clock).
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from exportcore.artifacts import FileArtifactStore, artifact_key
from exportcore.domain import ExportFormat
from exportcore.render import ExportHeader, NoteRecord, make_renderer

_local = threading.local()
_files: dict[int, Any] = {}
_lock = threading.Lock()

SELECT_NOTES = (
    "SELECT id AS note_id, title, content, pinned, updated_at FROM notes "
    "WHERE tenant_id = %s AND id = ANY(%s::bigint[]) ORDER BY id"
)


def _conn() -> psycopg.Connection[dict[str, Any]]:
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed or getattr(_local, "pid", None) != os.getpid():
        conn = psycopg.connect(os.environ["BENCH_DATABASE_URL"], row_factory=dict_row)
        _local.conn, _local.pid = conn, os.getpid()
    return conn


def _store() -> FileArtifactStore:
    store = getattr(_local, "store", None)
    if store is None:
        store = FileArtifactStore(Path(os.environ["BENCH_ARTIFACT_DIR"]))
        _local.store = store
    return store


def run_job(tenant: str, note_ids: list[int], job_id: str) -> int:
    """Read, render, write; returns the artifact size in bytes."""
    conn = _conn()
    with conn.transaction():
        rows = conn.execute(SELECT_NOTES, (tenant, note_ids)).fetchall()
    fmt = ExportFormat.JSON
    key = artifact_key(tenant, UUID(job_id), UUID(job_id), fmt.extension)
    with _store().open_writer(key) as out:
        renderer = make_renderer(fmt, out)
        renderer.begin(
            ExportHeader(
                id=job_id,
                tenant=tenant,
                created_at=datetime.now(UTC),
                format=fmt.value,
                count=len(rows),
            )
        )
        renderer.add([NoteRecord.from_row(r) for r in rows])
        renderer.end()
        return out.commit().size


def record(job_id: str, t_enqueued: float, t_started: float) -> None:
    """Append ``job_id t_enqueued t_started t_finished`` to this process's done file."""
    line = f"{job_id} {t_enqueued:.6f} {t_started:.6f} {time.time():.6f}\n"
    pid = os.getpid()
    with _lock:
        fh = _files.get(pid)
        if fh is None:
            out = Path(os.environ["BENCH_DONE_DIR"])
            out.mkdir(parents=True, exist_ok=True)
            fh = open(out / f"done-{pid}.log", "a", buffering=1)  # noqa: SIM115
            _files[pid] = fh
        fh.write(line)


def task_body(tenant: str, note_ids: list[int], job_id: str, t_enqueued: float) -> None:
    """What every peer's task does."""
    started = time.time()
    run_job(tenant, note_ids, job_id)
    record(job_id, t_enqueued, started)


def read_done(done_dir: Path) -> list[tuple[str, float, float, float]]:
    """Every line every worker process wrote so far."""
    out = []
    for f in sorted(done_dir.glob("done-*.log")):
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                out.append((parts[0], float(parts[1]), float(parts[2]), float(parts[3])))
    return out


def count_done(done_dir: Path) -> int:
    n = 0
    for f in done_dir.glob("done-*.log"):
        with open(f, "rb") as fh:
            n += fh.read().count(b"\n")
    return n
