"""The ``file://`` backend: artifacts as files under one root folder.

A writer streams into ``<key>.tmp`` next to the final name, then fsyncs the file, renames it
atomically onto the key and fsyncs the folder. Only a single machine (or a shared volume)
can serve what a worker wrote: on Kubernetes use the S3 backend.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, TypeVar
from uuid import UUID

from exportcore.artifacts.base import (
    ArtifactEntry,
    ArtifactStore,
    ArtifactWriter,
    CheckpointUntrusted,
    DurablePrefix,
    StoredArtifact,
    is_artifact_key,
    key_prefix,
    validate_key,
)
from exportcore.domain import ArtifactMissing

log = logging.getLogger(__name__)

_T = TypeVar("_T")

TEMP_SUFFIX = ".tmp"


class _FileWriter(ArtifactWriter):
    def __init__(self, key: str, final: Path) -> None:
        super().__init__(key)
        self._final = final
        self._tmp = final.with_name(final.name + TEMP_SUFFIX)
        final.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self._tmp, "wb")  # noqa: SIM115 - closed in commit/abort
        self._synced = 0

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        self._fh.write(data)

    def sync(self, min_bytes: int) -> DurablePrefix | None:
        """Flush and fsync the temporary file once ``min_bytes`` were written since the
        last fsync: its length is then the durable offset a checkpoint records."""
        if self._size - self._synced < min_bytes:
            return None
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._synced = self._size
        return self._prefix()

    def _release(self) -> None:
        with contextlib.suppress(OSError):
            self._fh.close()

    def _commit(self) -> None:
        self._sync()
        self._rename()
        _fsync_dir(self._final.parent)

    def _checked_sync(self) -> None:
        """:meth:`_sync`, not started once the job's deadline has passed."""
        self.check_deadline("making the artifact durable")
        self._sync()

    def _sync(self) -> None:
        """The file's bytes are durable (flush, fsync, close)."""
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()

    def _rename(self) -> None:
        """The complete file takes its final name (atomic)."""
        os.replace(self._tmp, self._final)

    def _abort(self) -> None:
        # Closing flushes what is still buffered; on a full or failing disk that raises
        # (ENOSPC, EIO) after the descriptor is closed. The bytes are discarded anyway, and
        # the temporary file must not be left behind.
        with contextlib.suppress(OSError):
            self._fh.close()
        try:
            self._tmp.unlink(missing_ok=True)
        except OSError as exc:  # orphan cleanup removes the temporary later
            log.warning(
                "could not remove an unfinished artifact",
                extra={"key": self.key, "error": type(exc).__name__},
            )


def _fsync_dir(path: Path) -> None:
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class _SyncThreads:
    """A few threads per process that run fsyncs concurrently (``os.fsync`` releases the
    GIL, and the filesystem's journal commits concurrent fsyncs together). Re-created after
    ``fork`` (Celery prefork children)."""

    def __init__(self, workers: int = 4) -> None:
        self._workers = workers
        self._pid: int | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def map(self, fn: Callable[[_T], None], items: Sequence[_T]) -> list[BaseException | None]:
        """Run ``fn`` on every item at once; the exception of each (None when it passed)."""
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="fsync")
                self._pid = os.getpid()
            pool = self._pool
        futures = [pool.submit(fn, item) for item in items]
        return [f.exception() for f in futures]


_SYNC = _SyncThreads()


class FileArtifactStore(ArtifactStore):
    """Artifacts as files under ``root``: temp file named with the lease token, fsync,
    atomic ``rename`` onto the final name, fsync of the directory."""

    backend = "file"

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def _path(self, key: str) -> Path:
        path = (self.root / validate_key(key)).resolve()
        if self.root not in path.parents:
            raise ValueError(f"artifact key escapes the store: {key!r}")
        return path

    def open_writer(self, key: str) -> ArtifactWriter:
        return _FileWriter(key, self._path(key))

    def commit_all(self, writers: Sequence[ArtifactWriter]) -> list[StoredArtifact | Exception]:
        """Commit a batch with overlapping fsyncs: every file is fsynced at once, then each
        is renamed onto its key, then every folder is fsynced at once. So each artifact is
        still fsynced and renamed with its folder before this returns (and before its
        finish commits), but a batch waits for about one fsync of each kind instead of one
        per artifact. A failing writer is aborted; the others are unaffected."""
        files = [w for w in writers if isinstance(w, _FileWriter)]
        if len(files) < 2 or len(files) != len(writers):
            return super().commit_all(writers)
        errors: list[BaseException | None] = list(_SYNC.map(_FileWriter._checked_sync, files))
        for i, w in enumerate(files):
            if errors[i] is None:
                try:
                    w._rename()
                except OSError as exc:
                    errors[i] = exc
        folders = sorted({w._final.parent for i, w in enumerate(files) if errors[i] is None})
        folder_errors = dict(zip(folders, _SYNC.map(_fsync_dir, folders), strict=True))
        out: list[StoredArtifact | Exception] = []
        for i, w in enumerate(files):
            error = errors[i] or folder_errors.get(w._final.parent)
            if error is None:
                out.append(w._committed(None))
                continue
            w.abort()
            if error is not errors[i]:  # renamed, but its folder is not durable: withdraw it
                with contextlib.suppress(OSError):
                    w._final.unlink()
            out.append(error if isinstance(error, Exception) else RuntimeError(repr(error)))
        return out

    def resume_writer(
        self, key: str, prefix: DurablePrefix
    ) -> tuple[ArtifactWriter, DurablePrefix]:
        """Copy the first ``prefix.nbytes`` of the old token's temporary file into this
        token's, hashing them on the way (the old holder's later appends stay in a file
        nobody reads: fenced out), fsync the copy. The old file is removed by
        :meth:`drop_prefix` once the checkpoint names the new one."""
        old = self._path(prefix.key)
        old = old.with_name(old.name + TEMP_SUFFIX)
        try:
            src = open(old, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            raise CheckpointUntrusted("missing", "the temporary file is gone") from None
        writer = _FileWriter(key, self._path(key))
        try:
            with src:
                left = prefix.nbytes
                while left:
                    block = src.read(min(left, 1 << 20))
                    if not block:
                        raise CheckpointUntrusted(
                            "short", f"the temporary file ends {left} bytes before the checkpoint"
                        )
                    writer.write(block)
                    left -= len(block)
            if writer._sha.hexdigest() != prefix.sha256:
                raise CheckpointUntrusted(
                    "hash_mismatch", "the file's prefix does not hash as recorded"
                )
            durable = writer.sync(0)
            assert durable is not None
            return writer, durable
        except BaseException:
            writer.abort()
            raise

    def drop_prefix(self, prefix: DurablePrefix) -> None:
        old = self._path(prefix.key)
        try:
            old.with_name(old.name + TEMP_SUFFIX).unlink(missing_ok=True)
        except OSError as exc:
            log.warning(
                "could not remove a taken-over temporary file",
                extra={"key": prefix.key, "error": type(exc).__name__},
            )

    def open_reader(self, ref: str) -> tuple[BinaryIO, int]:
        path = self._path(ref)
        try:
            fh = open(path, "rb")  # noqa: SIM115 - the caller closes the stream
        except FileNotFoundError as exc:
            raise ArtifactMissing(f"artifact {ref} is missing from storage") from exc
        return fh, os.fstat(fh.fileno()).st_size

    def delete(self, ref: str) -> bool:
        path = self._path(ref)
        removed = False
        for candidate in (path, path.with_name(path.name + TEMP_SUFFIX)):
            try:
                candidate.unlink()
                removed = True
            except FileNotFoundError:
                pass
        return removed

    def entries(
        self, tenant_id: str | None = None, job_id: UUID | None = None
    ) -> Iterator[ArtifactEntry]:
        prefix = key_prefix(tenant_id, job_id)
        base = self.root / prefix if prefix else self.root
        depth = 3 - prefix.count("/")
        if not base.is_dir():
            return
        for path in base.glob("/".join(["*"] * depth)):
            rel = path.relative_to(self.root).as_posix()
            key = rel.removesuffix(TEMP_SUFFIX)
            if not is_artifact_key(key):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:  # renamed or deleted while listing
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            yield ArtifactEntry(
                key=key,
                modified_at=datetime.fromtimestamp(st.st_mtime, tz=UTC),
                complete=not rel.endswith(TEMP_SUFFIX),
            )
