"""Request and response models of the API (strict: no silent coercion of "1" to 1)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from exportcore.db import Row

FormatName = Literal["json", "ndjson", "markdown_zip"]


class ExportCreate(BaseModel):
    """``{"note_ids": [...]}`` or ``{"all": true}``, and a format (default ``json``)."""

    model_config = ConfigDict(extra="forbid")

    note_ids: list[StrictInt] | None = Field(
        default=None,
        min_length=1,
        max_length=100_000,
        description="ids of the notes to export (duplicates are ignored)",
    )
    all: StrictBool = Field(default=False, description="export every note of the tenant")
    format: FormatName = "json"


class ExportError(BaseModel):
    """Why the last attempt failed."""

    code: str
    detail: str | None = None


class ExportResult(BaseModel):
    """The published artifact of a succeeded export."""

    rows: int
    bytes: int
    sha256: str
    download: str


class ExportLinks(BaseModel):
    """Hypermedia links of an export."""

    self: str
    download: str
    events: str


class ExportOut(BaseModel):
    """The status of an export job."""

    id: UUID
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    format: FormatName
    queue: str
    note_count: int
    attempts: int
    max_attempts: int
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    next_attempt_at: datetime
    deadline_at: datetime
    replay_of: UUID | None
    error: ExportError | None
    result: ExportResult | None
    links: ExportLinks


class EventOut(BaseModel):
    """One entry of a job's history."""

    id: int
    at: datetime
    kind: str
    from_status: str | None
    to_status: str | None
    attempt: int | None
    lease_token: UUID | None
    message_id: UUID | None
    detail: dict[str, Any]


def links_for(job_id: UUID, base_url: str = "") -> ExportLinks:
    """Links relative to the API root, or absolute when ``base_url`` is set."""
    root = f"{base_url.rstrip('/')}/v1/exports/{job_id}"
    return ExportLinks(self=root, download=f"{root}/download", events=f"{root}/events")


def export_out(job: Row, base_url: str = "") -> ExportOut:
    """Render a job row for API consumers (never the payload or lease token)."""
    links = links_for(job["id"], base_url)
    result = None
    if job["status"] == "succeeded":
        result = ExportResult(
            rows=job["result_rows"],
            bytes=job["result_bytes"],
            sha256=job["result_sha256"],
            download=links.download,
        )
    error = (
        ExportError(code=job["error_code"], detail=job["error_detail"])
        if job["error_code"]
        else None
    )
    return ExportOut(
        id=job["id"],
        status=job["status"],
        format=job["format"],
        queue=job["queue"],
        note_count=job["note_count"],
        attempts=job["attempts"],
        max_attempts=job["max_attempts"],
        cancel_requested=job["cancel_requested"],
        created_at=job["created_at"],
        started_at=job["started_at"],
        finished_at=job["finished_at"],
        updated_at=job["updated_at"],
        next_attempt_at=job["next_attempt_at"],
        deadline_at=job["deadline_at"],
        replay_of=job["replay_of"],
        error=error,
        result=result,
        links=links,
    )


class DeadLetterOut(BaseModel):
    """A failed job that needs a person: why it failed, and its replay if any."""

    id: int
    job_id: UUID
    tenant_id: str
    reason: str
    detail: str
    attempts: int
    created_at: datetime
    replayed_by: UUID | None


class DeadLetterPage(BaseModel):
    """One page of dead letters; pass ``next_cursor`` as ``cursor`` for the next."""

    items: list[DeadLetterOut]
    next_cursor: int | None


class ExportPage(BaseModel):
    """One page of the caller's exports, newest first; pass ``next_cursor`` as ``cursor``."""

    items: list[ExportOut]
    next_cursor: str | None
