"""Shared shapes of the renderers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True)
class ExportHeader:
    """What every format says about the export itself."""

    id: str
    tenant: str
    created_at: datetime
    format: str
    count: int

    @classmethod
    def of_job(cls, job: Any) -> ExportHeader:
        """The header of an ``export_jobs`` row: a typed row (``store.jobs.JobRow``) or a
        mapping of its columns."""
        if isinstance(job, Mapping):
            return cls(
                id=str(job["id"]),
                tenant=job["tenant_id"],
                created_at=job["created_at"],
                format=job["format"],
                count=job["note_count"],
            )
        return cls(
            id=str(job.id),
            tenant=job.tenant_id,
            created_at=job.created_at,
            format=job.format,
            count=job.note_count,
        )

    def as_json(self) -> dict[str, Any]:
        """The ``export`` object of the JSON format (timestamps in ISO 8601)."""
        return {
            "id": self.id,
            "tenant": self.tenant,
            "created_at": self.created_at.isoformat(),
            "format": self.format,
            "count": self.count,
        }


@dataclass(frozen=True)
class NoteRecord:
    """One snapshot note as it appears in an export."""

    id: int
    title: str
    content: str
    pinned: bool
    updated_at: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> NoteRecord:
        """Build from an ``export_job_items`` row (``note_id``, ``title``, …)."""
        return cls(
            id=int(row["note_id"]),
            title=row["title"],
            content=row["content"],
            pinned=bool(row["pinned"]),
            updated_at=row["updated_at"],
        )

    def as_json(self) -> dict[str, Any]:
        """``{id, title, content, pinned, updated_at}`` with an ISO 8601 timestamp."""
        return {
            "id": self.id,
            "title": self.title,
            "content": self.content,
            "pinned": self.pinned,
            "updated_at": self.updated_at.isoformat(),
        }


class Sink(Protocol):
    """Where a renderer writes: anything with ``write(bytes)``, ``tell()`` and ``flush()``."""

    def write(self, data: bytes, /) -> int:
        """Append ``data``; returns the number of bytes written."""
        ...

    def tell(self) -> int:
        """Bytes written so far."""
        ...

    def flush(self) -> None:
        """Push buffered bytes on (zipfile calls it)."""
        ...


class Renderer(ABC):
    """Writes one export to ``out`` incrementally."""

    def __init__(self, out: Sink) -> None:
        self.out = out
        self.rows = 0

    @abstractmethod
    def begin(self, header: ExportHeader) -> None:
        """Write whatever precedes the notes."""

    @abstractmethod
    def add(self, notes: Sequence[NoteRecord]) -> None:
        """Write one chunk of notes, in order."""

    @abstractmethod
    def end(self) -> None:
        """Write whatever follows the notes; the sink is not closed."""
