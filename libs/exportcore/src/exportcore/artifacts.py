"""Artifact storage. Artifacts are written under a key that includes the lease token, become
visible atomically only when complete, and carry the SHA-256 and size computed while
streaming (DESIGN.md invariant 5).

Keys look like ``<tenant>/<job id>/<lease token>.<ext>``; every part is validated, so no
user-supplied text ever reaches a path.
"""

from __future__ import annotations

import hashlib
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import BinaryIO
from uuid import UUID

from exportcore.domain import ArtifactMissing

_TENANT = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_EXT = re.compile(r"[a-z0-9]{1,8}")
_KEY = re.compile(r"[a-z0-9][a-z0-9-]{0,62}/[0-9a-f-]{36}/[0-9a-f-]{36}\.[a-z0-9]{1,8}")
TEMP_SUFFIX = ".tmp"


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


@dataclass(frozen=True)
class StoredArtifact:
    """A completed artifact: its key (the job's ``result_ref``), SHA-256 hex and size in bytes."""

    ref: str
    sha256: str
    size: int


class ArtifactWriter(ABC):
    """A binary sink that hashes and counts what it writes; ``commit()`` makes it visible.

    Used as a context manager: leaving the block without ``commit()`` aborts the write and
    removes whatever was written.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self._sha = hashlib.sha256()
        self._size = 0
        self._done = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append ``data``; returns the number of bytes written."""
        self._sha.update(data)
        self._size += len(data)
        self._write(data)
        return len(data)

    def tell(self) -> int:
        """Bytes written so far (lets zipfile stream without seeking)."""
        return self._size

    def flush(self) -> None:  # noqa: B027 - deliberately a no-op, not abstract
        """No-op for callers (zipfile) that flush; durability comes from ``commit()``."""

    def commit(self) -> StoredArtifact:
        """Make the artifact durable and visible under its key; returns what was stored."""
        self._commit()
        self._done = True
        return StoredArtifact(ref=self.key, sha256=self._sha.hexdigest(), size=self._size)

    def abort(self) -> None:
        """Discard everything written; the key never becomes visible."""
        if not self._done:
            self._done = True
            self._abort()

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
    def _commit(self) -> None: ...

    @abstractmethod
    def _abort(self) -> None: ...


class ArtifactStore(ABC):
    """Where artifacts live. Implementations must make a key visible only when complete."""

    @abstractmethod
    def open_writer(self, key: str) -> ArtifactWriter:
        """A writer for a new artifact at ``key`` (validated)."""

    @abstractmethod
    def open_reader(self, ref: str) -> tuple[BinaryIO, int]:
        """``(stream, size in bytes)`` of a stored artifact; raises ArtifactMissing."""

    @abstractmethod
    def delete(self, ref: str) -> bool:
        """Remove an artifact and any unfinished temporary of the same key; True if
        something was removed."""

    @abstractmethod
    def list_older_than(self, cutoff: datetime) -> Iterator[tuple[str, datetime]]:
        """``(key, modified at)`` of artifacts, complete or abandoned half-written, last
        modified before ``cutoff`` (for orphan cleanup and retention). A key may appear
        twice when both forms exist; ``delete(key)`` removes both."""


class _FileWriter(ArtifactWriter):
    def __init__(self, key: str, final: Path) -> None:
        super().__init__(key)
        self._final = final
        self._tmp = final.with_name(final.name + TEMP_SUFFIX)
        final.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self._tmp, "wb")  # noqa: SIM115 - closed in commit/abort

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        self._fh.write(data)

    def _commit(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        os.replace(self._tmp, self._final)
        dir_fd = os.open(self._final.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _abort(self) -> None:
        try:
            # Closing flushes what is still buffered; on a full or failing disk that raises
            # (ENOSPC, EIO) after the descriptor is closed. The bytes are discarded anyway,
            # and the temporary file must not be left behind.
            self._fh.close()
        except OSError:
            pass
        finally:
            self._tmp.unlink(missing_ok=True)


class FileArtifactStore(ArtifactStore):
    """Artifacts as files under ``root``: temp file named with the lease token, fsync,
    atomic ``rename`` onto the final name, fsync of the directory."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def _path(self, key: str) -> Path:
        path = (self.root / validate_key(key)).resolve()
        if self.root not in path.parents:
            raise ValueError(f"artifact key escapes the store: {key!r}")
        return path

    def open_writer(self, key: str) -> ArtifactWriter:
        return _FileWriter(key, self._path(key))

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

    def list_older_than(self, cutoff: datetime) -> Iterator[tuple[str, datetime]]:
        limit = cutoff.timestamp()
        if not self.root.exists():
            return
        for path in self.root.glob("*/*/*"):
            st = path.stat()
            if st.st_mtime >= limit:
                continue
            rel = path.relative_to(self.root).as_posix()
            key = rel.removesuffix(TEMP_SUFFIX)
            if _KEY.fullmatch(key):
                yield key, datetime.fromtimestamp(st.st_mtime, tz=UTC)


def open_store(artifact_dir: Path) -> ArtifactStore:
    """The configured artifact store (the local filesystem for now)."""
    return FileArtifactStore(artifact_dir)
