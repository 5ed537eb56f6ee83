"""The artifact storage interface shared by every backend.

Artifacts are written under a key that includes the lease token, become visible atomically
only when complete, and carry the SHA-256 and size computed while streaming
(docs/architecture.md INV-5 artifact-under-lease-token).

Keys look like ``<tenant>/<job id>/<lease token>.<ext>``; every part is validated, so no
user-supplied text ever reaches a path or an object key.
"""

from __future__ import annotations

import hashlib
import re
import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO, ClassVar
from uuid import UUID

if TYPE_CHECKING:
    from exportcore.deadlines import Deadline

_TENANT = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_EXT = re.compile(r"[a-z0-9]{1,8}")
_KEY = re.compile(r"[a-z0-9][a-z0-9-]{0,62}/[0-9a-f-]{36}/[0-9a-f-]{36}\.[a-z0-9]{1,8}")


DEADLINE_CHECK_WRITES = 256
"""A writer bound to a deadline checks it on its first write and every this many writes."""


def artifact_key(tenant_id: str, job_id: UUID, lease_token: UUID, ext: str) -> str:
    """``<tenant>/<job id>/<lease token>.<ext>``; raises ValueError on an invalid part."""
    if not _TENANT.fullmatch(tenant_id):
        raise ValueError(f"invalid tenant id for an artifact key: {tenant_id!r}")
    if not _EXT.fullmatch(ext):
        raise ValueError(f"invalid artifact extension: {ext!r}")
    return f"{tenant_id}/{UUID(str(job_id))}/{UUID(str(lease_token))}.{ext}"


def validate_key(key: str) -> str:
    """Return ``key`` if it has the artifact key shape, else raise ValueError."""
    if not _KEY.fullmatch(key):
        raise ValueError(f"not an artifact key: {key!r}")
    return key


def is_artifact_key(key: str) -> bool:
    """True when ``key`` has the artifact key shape (nothing else is ever listed or deleted)."""
    return _KEY.fullmatch(key) is not None


def key_prefix(tenant_id: str | None = None, job_id: UUID | None = None) -> str:
    """The validated key prefix of a tenant (``"<tenant>/"``) or of one job of a tenant
    (``"<tenant>/<job id>/"``); ``""`` for everything. A job needs its tenant."""
    if tenant_id is None:
        if job_id is not None:
            raise ValueError("a job prefix needs the tenant id")
        return ""
    if not _TENANT.fullmatch(tenant_id):
        raise ValueError(f"invalid tenant id for an artifact key: {tenant_id!r}")
    if job_id is None:
        return f"{tenant_id}/"
    return f"{tenant_id}/{UUID(str(job_id))}/"


@dataclass(frozen=True)
class StoredArtifact:
    """A completed artifact: its key (the job's ``result_ref``), SHA-256 hex, size in bytes,
    and the store's own ETag when the backend has one (S3; None for files)."""

    ref: str
    sha256: str
    size: int
    etag: str | None = None


@dataclass(frozen=True)
class DurablePrefix:
    """The durable prefix of an unfinished write, as a checkpoint records it: the key the
    write is under, its length in bytes and SHA-256 (hex), and for a multipart upload its
    id and the parts ``(number, ETag, size)`` uploaded (docs/architecture.md
    "Checkpoints")."""

    key: str
    nbytes: int
    sha256: str
    upload_id: str | None = None
    parts: tuple[tuple[int, str, int], ...] = ()


class CheckpointUntrusted(Exception):
    """A durable prefix that cannot be taken over (the file or upload is gone, shorter, or
    its bytes do not hash to the recorded SHA-256): the export starts over. ``reason`` is
    the metric label (``missing``, ``short``, ``hash_mismatch``, ``layout``; the checkpoint
    module adds ``segments``). A store that is merely unavailable raises its own error
    instead: the attempt retries and the checkpoint stays."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class ArtifactEntry:
    """One listed artifact. ``complete`` is False for something a writer never finished (a
    temporary file, an incomplete multipart upload): never readable, only deletable."""

    key: str
    modified_at: datetime
    complete: bool


class ArtifactWriter(ABC):
    """A binary sink that hashes and counts what it writes; ``commit()`` makes it visible.

    Used as a context manager: leaving the block without ``commit()`` aborts the write and
    removes whatever was written. A writer bound to a job's deadline (:meth:`bound_by`)
    starts no write, upload or commit once it has passed, and a backend bounds its own calls'
    timeouts by the time left (:mod:`exportcore.deadlines`).
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self.deadline: Deadline | None = None
        self._writes_unchecked = DEADLINE_CHECK_WRITES  # the first write checks
        self._sha = hashlib.sha256()
        self._size = 0
        self._done = False
        self.retain = False
        """Set once a checkpoint records this write's durable prefix: an abort then leaves
        the prefix for the checkpoint's next owner (or orphan cleanup) instead of deleting
        it, since the job is not over."""

    def bound_by(self, deadline: Deadline | None) -> ArtifactWriter:
        """Bind this writer's I/O to ``deadline`` (the job's); returns self. Raises
        ``DeadlineExceeded`` from then on when a write or the commit would start late."""
        self.deadline = deadline
        return self

    def check_deadline(self, what: str) -> None:
        """Raise ``DeadlineExceeded`` (``what`` names the step) when the deadline passed."""
        if self.deadline is not None:
            self.deadline.check(what)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append ``data``; returns the number of bytes written."""
        n = memoryview(data).nbytes
        if self.deadline is not None:
            # every DEADLINE_CHECK_WRITES writes (zipfile makes ~8 small ones per note; a
            # check per write cost ~3 % of a markdown_zip render), and before every upload
            # and the commit, which are the calls that can block
            self._writes_unchecked += 1
            if self._writes_unchecked >= DEADLINE_CHECK_WRITES:
                self._writes_unchecked = 0
                self.deadline.check("writing the artifact")
        self._sha.update(data)
        self._size += n
        self._write(data)
        return n

    def tell(self) -> int:
        """Bytes written so far (lets zipfile stream without seeking)."""
        return self._size

    def sha256(self) -> str:
        """SHA-256 (hex) of the bytes written so far (what the commit will record)."""
        return self._sha.copy().hexdigest()

    def flush(self) -> None:  # noqa: B027 - deliberately a no-op, not abstract
        """No-op for callers (zipfile) that flush; durability comes from ``commit()``."""

    def commit(self) -> StoredArtifact:
        """Make the artifact durable and visible under its key; returns what was stored."""
        self.check_deadline("committing the artifact")
        etag = self._commit()
        return self._committed(etag)

    def _committed(self, etag: str | None) -> StoredArtifact:
        """Mark the write done (a backend that committed by other means calls this)."""
        self._done = True
        return StoredArtifact(
            ref=self.key, sha256=self._sha.hexdigest(), size=self._size, etag=etag
        )

    def abort(self) -> None:
        """Discard everything written; the key never becomes visible. A retained write
        (``retain``) keeps its durable prefix."""
        if not self._done:
            self._done = True
            if self.retain:
                self._release()
            else:
                self._abort()

    def sync(self, min_bytes: int) -> DurablePrefix | None:
        """At a chunk boundary: when at least ``min_bytes`` were written since the last
        durable point, make every byte written so far durable and return the prefix
        (None otherwise, or when the backend cannot make a prefix durable yet)."""
        return None

    def _prefix(self, **extra: object) -> DurablePrefix:
        """The durable prefix of everything written so far (hash of a copy of the state:
        hashlib cannot export it, but can copy it)."""
        return DurablePrefix(self.key, self._size, self._sha.copy().hexdigest(), **extra)  # type: ignore[arg-type]

    def _release(self) -> None:  # noqa: B027 - optional hook
        """Let go of a retained write without deleting its durable prefix."""

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._done:
            self.abort()

    @abstractmethod
    def _write(self, data: bytes | bytearray | memoryview) -> None: ...

    @abstractmethod
    def _commit(self) -> str | None:
        """Make the artifact visible; returns the store's ETag, if it has one."""

    @abstractmethod
    def _abort(self) -> None:
        """Remove what was written. Must not raise for a storage error (log it instead):
        it runs while another exception propagates, and orphan cleanup removes leftovers."""


class ArtifactStore(ABC):
    """Where artifacts live. Implementations must make a key visible only when complete."""

    backend: ClassVar[str] = "abstract"
    """Short backend name (``file``, ``s3``) for logs and metrics labels."""

    @abstractmethod
    def open_writer(self, key: str) -> ArtifactWriter:
        """A writer for a new artifact at ``key`` (validated)."""

    def commit_all(self, writers: Sequence[ArtifactWriter]) -> list[StoredArtifact | Exception]:
        """Commit several writers of this store (a worker's batch); one result per writer,
        in order: what was stored, or the error that writer's commit raised (that writer is
        aborted; the others are unaffected). Each artifact is durable and visible when this
        returns. Backends may overlap the commits (the file store overlaps its fsyncs);
        this default commits one after the other."""
        out: list[StoredArtifact | Exception] = []
        for writer in writers:
            try:
                out.append(writer.commit())
            except Exception as exc:
                writer.abort()
                out.append(exc)
        return out

    def resume_writer(
        self, key: str, prefix: DurablePrefix
    ) -> tuple[ArtifactWriter, DurablePrefix]:
        """A writer for ``key`` (this lease token's) that already holds ``prefix`` (another
        token's durable prefix), re-hashed on the way, and that prefix as it is now
        recorded under ``key``; the old write can no longer reach the new one (fencing).
        Raises CheckpointUntrusted when the prefix cannot be trusted; then nothing under
        ``key`` is left behind."""
        raise CheckpointUntrusted("layout", f"the {self.backend} store cannot resume a write")

    def drop_prefix(self, prefix: DurablePrefix) -> None:  # noqa: B027 - optional hook
        """Delete what is left of a taken-over prefix (never raises for a storage error:
        orphan cleanup removes leftovers)."""

    @abstractmethod
    def open_reader(self, ref: str) -> tuple[BinaryIO, int]:
        """``(stream, size in bytes)`` of a stored artifact; raises ArtifactMissing."""

    @abstractmethod
    def delete(self, ref: str) -> bool:
        """Remove an artifact and any unfinished write of the same key (temporary file,
        incomplete multipart upload); True if something was removed."""

    @abstractmethod
    def entries(
        self, tenant_id: str | None = None, job_id: UUID | None = None
    ) -> Iterator[ArtifactEntry]:
        """Every artifact (complete or not) of the store, of one tenant, or of one job of a
        tenant. Objects that do not have the artifact key shape are never listed."""

    def list_older_than(self, cutoff: datetime) -> Iterator[tuple[str, datetime]]:
        """``(key, modified at)`` of artifacts, complete or abandoned half-written, last
        modified before ``cutoff`` (for orphan cleanup and retention). A key may appear
        twice when both forms exist; ``delete(key)`` removes both."""
        for entry in self.entries():
            if entry.modified_at < cutoff:
                yield entry.key, entry.modified_at

    def presigned_url(
        self, ref: str, *, expires_in: int, filename: str, media_type: str
    ) -> str | None:
        """A short-lived URL that downloads ``ref`` without credentials, or None when the
        backend cannot hand out such URLs (the caller then streams). Raises
        ArtifactMissing when the artifact is gone."""
        validate_key(ref)
        return None


# --- missing artifacts: a plain process-local counter (exposed by the metrics module) ----

_missing_lock = threading.Lock()
_missing: Counter[str] = Counter()


def record_missing(backend: str) -> None:
    """Count one download of a succeeded export whose artifact was gone (answered 410), in
    this process and in ``exports_artifact_missing_total{backend}``."""
    from exportcore.metrics import ARTIFACT_MISSING

    ARTIFACT_MISSING.labels(backend).inc()
    with _missing_lock:
        _missing[backend] += 1


def missing_counts() -> dict[str, int]:
    """``{backend: missing artifacts seen by this process}`` since it started."""
    with _missing_lock:
        return dict(_missing)
