"""Request and response models of the API (strict: no silent coercion of "1" to 1)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
)

from exportcore.db import Row
from exportcore.domain import (
    METADATA_KEY_MAX,
    METADATA_MAX_KEYS,
    METADATA_VALUE_MAX,
    TAG_MAX,
    TAGS_MAX,
    ExportFormat,
    Labels,
)
from exportcore.encryption import EXTENSION as ENCRYPTED_EXTENSION
from exportcore.replays import Correction

FormatName = Literal["json", "ndjson", "markdown_zip"]

# RFC 3339 section 5.6 "date-time" (what OpenAPI's format: date-time means): a full date, "T",
# a time with optional fraction, and an offset ("Z" or +hh:mm), case-insensitive
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)


def _rfc3339(value: object) -> object:
    if isinstance(value, datetime) or (isinstance(value, str) and _RFC3339.fullmatch(value)):
        return value
    raise ValueError("expected an RFC 3339 date-time with an offset, e.g. 2026-01-31T12:00:00Z")


Metadata = Annotated[
    dict[str, StrictStr] | None,
    Field(
        description=f"your own references: at most {METADATA_MAX_KEYS} keys of 1-"
        f"{METADATA_KEY_MAX} letters, digits, '_', '.', ':' or '-', each to a string of at "
        f"most {METADATA_VALUE_MAX} characters (docs/api.md, Metadata and tags); returned "
        "with the export, in its webhooks, and filterable (metadata[key]=value)",
        examples=[{"order_id": "ord_1234"}],
    ),
]
"""A request's ``metadata`` (bounds checked by :meth:`exportcore.domain.Labels.build`: a
422 ``invalid_labels`` naming the key)."""
Tags = Annotated[
    list[StrictStr] | None,
    Field(
        description=f"at most {TAGS_MAX} tags of 1-{TAG_MAX} letters, digits, '_', '.', ':' "
        "or '-', starting with a letter or digit; duplicates count once; filterable (tag=)",
        examples=[["nightly", "team-a"]],
    ),
]
"""A request's ``tags`` (checked by :meth:`exportcore.domain.Labels.build`)."""


Rfc3339 = Annotated[datetime, BeforeValidator(_rfc3339)]
"""A request's instant: an RFC 3339 date-time string only (pydantic alone would also take
a number or a numeric string, ``0.5``, as Unix seconds, which the schema does not allow);
raises a 422 (``value_error``) naming the field otherwise."""


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
    since: UUID | None = Field(
        default=None,
        description=(
            "with all=true: a delta of what changed since this earlier succeeded export of "
            "all notes in the same format (its base), tombstones included"
        ),
    )
    metadata: Metadata = None
    tags: Tags = None

    def labels(self) -> Labels:
        """The request's metadata and tags, validated (raises
        :class:`~exportcore.domain.InvalidLabels`)."""
        return Labels.build(self.metadata, self.tags)

    recipients: list[str] | None = Field(
        default=None,
        max_length=16,
        description=(
            "age X25519 recipients (public keys, age1…) the artifact is encrypted to, "
            "beside the tenant's own: only a holder of a matching identity can read it "
            '(docs/api.md "Encrypted exports"); part of the request an Idempotency-Key '
            "compares"
        ),
    )


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
    encrypted: bool = Field(
        default=False,
        description="the artifact is an age file (bytes and sha256 are the ciphertext's); "
        "its signed envelope is at the envelope link",
    )
    envelope: str | None = Field(
        default=None, description="an encrypted export's signed envelope (GET)"
    )


class ExportBase(BaseModel):
    """The base of a delta: the export it is since, and that export's manifest SHA-256."""

    id: UUID
    manifest_sha256: str | None


class ExportCheckpoint(BaseModel):
    """What a running bulk export has made durable so far (docs/architecture.md
    "Checkpoints"): notes and bytes, takeovers, and notes the latest takeover carried over
    instead of rendering them again."""

    notes: int
    bytes: int
    resumes: int
    notes_carried_over: int
    at: datetime


class ExportLinks(BaseModel):
    """Hypermedia links of an export."""

    self: str
    download: str
    events: str


class ExportProgress(BaseModel):
    """How far an export is: ``done`` of ``total`` notes."""

    done: int = Field(
        description="notes rendered so far: while running, as the worker last reported them "
        "at a lease renewal (about every LEASE_SECONDS / 3; a retry starts again from 0); "
        "all of them once succeeded"
    )
    total: int = Field(description="notes in the export's snapshot (note_count)")


TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
"""Statuses that never change again (docs/architecture.md INV-14 terminal-is-final)."""


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
    terminal: bool = Field(
        description="true once the status is succeeded, failed or cancelled: it never changes "
        "again (a replay is a new export), so a client stops polling"
    )
    progress: ExportProgress | None = Field(
        description="notes done of total while queued (0), running and once succeeded; null "
        "for a failed or cancelled export"
    )
    base: ExportBase | None = None
    checkpoint: ExportCheckpoint | None = None
    dispatch_paused: bool | None = Field(
        default=None,
        description="in the status of one export (GET /v1/exports/{id}): true while it is "
        "queued and an operator has paused dispatch of its queue (or of its tenant on it), "
        "so it waits and runs once dispatch resumes (its deadline still applies); null in "
        "lists and answers of other requests",
    )
    recipients: list[str] | None = Field(
        default=None,
        description="the age recipients the request named (the tenant's own are added when "
        "the export renders); null when it named none",
    )
    error: ExportError | None
    result: ExportResult | None
    metadata: dict[str, str] = Field(description="the metadata it was submitted with ({})")
    tags: list[str] = Field(description="its tags, sorted ([])")
    links: ExportLinks


class EventOut(BaseModel):
    """One entry of a job's history, as its tenant sees it: no lease tokens, message ids,
    storage keys or internal error details (operators read those at
    ``/v1/admin/exports/{id}/events``). ``detail`` keeps only :data:`TENANT_EVENT_KEYS`."""

    id: int
    at: datetime
    kind: str
    from_status: str | None
    to_status: str | None
    attempt: int | None
    detail: dict[str, Any]


TENANT_EVENT_KEYS = frozenset(
    {
        "source",
        "note_count",
        "schedule_id",
        "scheduled_at",
        "progress",
        "rows",
        "bytes",
        "sha256",
        "error_code",
        "next_attempt_at",
        "replay_of",
        "replayed_by",
        "corrected",
        "snapshot",
        "dispatch_count",
        "base_job_id",
        "notes",
        "resumes",
        "requested_by",
    }
)
"""The history ``detail`` keys a tenant may read. An allowlist: a key added to some event
later stays operator-only until it is listed here (``result_ref``, ``etag``,
``error_detail``, ``lease_expires_at``, trace contexts never are)."""


def tenant_event(row: Row) -> EventOut:
    """A history row for its tenant: the fields and ``detail`` keys a tenant may see."""
    detail = {k: v for k, v in (row["detail"] or {}).items() if k in TENANT_EVENT_KEYS}
    return EventOut(
        id=row["id"],
        at=row["at"],
        kind=row["kind"],
        from_status=row["from_status"],
        to_status=row["to_status"],
        attempt=row["attempt"],
        detail=detail,
    )


class AdminEventOut(EventOut):
    """One entry of a job's history for operators: everything, lease tokens, the message
    (outbox event = Celery task) id and the full ``detail`` included."""

    lease_token: UUID | None
    message_id: UUID | None


# What a tenant reads about a failure: the stable code and a fixed sentence per code. The
# recorded detail (exception classes, storage error codes, setting names) is for operators.
TENANT_ERROR_DETAILS = {
    "attempts_exhausted": "every attempt failed; the export is not retried automatically",
    "deadline_exceeded": "the export did not finish before its deadline",
    "invalid_snapshot": "the export's input could not be read back completely",
    "snapshot_version_missing": "a note of the export could not be read back as it was",
    "artifact_too_large": "the export is too large to be stored",
    "storage_io_error": "the file could not be written",
    "storage_error": "the file could not be stored",
    "storage_unavailable": "the file storage was unavailable",
    "storage_misconfigured": "the file storage refused the export",
    "database_unavailable": "a temporary service problem interrupted the export",
    "broker_unavailable": "a temporary service problem interrupted the export",
    "lease_expired": "the worker running the export stopped",
    "downstream_throttled": "the file storage or the notes source was busy",
    "internal_error": "an internal error interrupted the export",
}
TENANT_ERROR_DEFAULT = "the export failed; an operator can see the details"


def links_for(job_id: UUID, base_url: str = "") -> ExportLinks:
    """Links relative to the API root, or absolute when ``base_url`` is set."""
    root = f"{base_url.rstrip('/')}/v1/exports/{job_id}"
    return ExportLinks(self=root, download=f"{root}/download", events=f"{root}/events")


def export_out(
    job: Row,
    base_url: str = "",
    *,
    operator: bool = False,
    checkpoint: Row | None = None,
    dispatch_paused: bool | None = None,
) -> ExportOut:
    """Render a job row for API consumers (never the payload, lease token or storage key);
    ``checkpoint``: the job's ``checkpoint_progress`` row, when it has one;
    ``dispatch_paused``: whether a dispatch pause holds it (read by the status only).

    A tenant reads the error's code with a fixed sentence per code
    (:data:`TENANT_ERROR_DETAILS`); an operator (``operator=True``) the recorded detail.
    """
    links = links_for(job["id"], base_url)
    labels = Labels.from_payload(job["payload"])
    result = None
    if job["status"] == "succeeded":
        encrypted = str(job.get("result_ref") or "").endswith("." + ENCRYPTED_EXTENSION)
        result = ExportResult(
            rows=job["result_rows"],
            bytes=job["result_bytes"],
            sha256=job["result_sha256"],
            download=links.download,
            encrypted=encrypted,
            envelope=f"{links.self}/envelope" if encrypted else None,
        )
    status = job["status"]
    progress = None
    if status == "succeeded":
        progress = ExportProgress(done=job["result_rows"], total=job["note_count"])
    elif status in ("queued", "running"):
        done = min(job.get("progress") or 0, job["note_count"]) if status == "running" else 0
        progress = ExportProgress(done=done, total=job["note_count"])
    error = None
    if job["error_code"]:
        detail = (
            job["error_detail"]
            if operator
            else TENANT_ERROR_DETAILS.get(job["error_code"], TENANT_ERROR_DEFAULT)
        )
        error = ExportError(code=job["error_code"], detail=detail)
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
        terminal=status in TERMINAL_STATUSES,
        progress=progress,
        base=(
            ExportBase(id=job["base_job_id"], manifest_sha256=job.get("base_manifest_sha256"))
            if job.get("base_job_id")
            else None
        ),
        dispatch_paused=dispatch_paused,
        checkpoint=(
            ExportCheckpoint(
                notes=checkpoint["rows"],
                bytes=checkpoint["bytes"],
                resumes=checkpoint["resumes"],
                notes_carried_over=checkpoint["carried_rows"],
                at=checkpoint["updated_at"],
            )
            if checkpoint is not None
            else None
        ),
        recipients=(job.get("payload") or {}).get("recipients"),
        error=error,
        result=result,
        metadata=labels.metadata_dict,
        tags=list(labels.tags),
        links=links,
    )


DeadLetterState = Literal["open", "replayed", "resolved"]


class DeadLetterOut(BaseModel):
    """A failed job that needs a person: why it failed, its state, its replay if any."""

    id: int
    job_id: UUID
    tenant_id: str
    reason: str
    detail: str
    attempts: int
    created_at: datetime
    state: DeadLetterState = Field(
        description="open (needs a person), replayed (a replay job was written) or resolved "
        "(closed by an operator)"
    )
    replayed_by: UUID | None = Field(description="the replay job, when replayed")
    replay_status: Literal["queued", "running", "succeeded", "failed", "cancelled"] | None
    replayed_at: datetime | None
    replay_requested_by: str | None = Field(description="the operator key that asked")
    resolved_at: datetime | None
    resolved_by: str | None = Field(description="the operator key that resolved it")
    resolution_note: str | None


class DeadLetterPage(BaseModel):
    """One page of dead letters; pass ``next_cursor`` as ``cursor`` for the next."""

    items: list[DeadLetterOut]
    next_cursor: int | None


class DeadLetterResolve(BaseModel):
    """Close a dead letter without (another) replay; the note says why."""

    model_config = ConfigDict(extra="forbid")

    note: str | None = Field(default=None, max_length=1000, description="why it is resolved")


class ReplayCorrection(BaseModel):
    """A corrected input for a replay, after review: another ``format`` and/or another
    selection (``note_ids``, or ``all``). Omitted fields keep the failed job's; an empty
    body (or none) replays the failed job's own snapshot."""

    model_config = ConfigDict(extra="forbid")

    format: FormatName | None = Field(default=None, description="the corrected format")
    note_ids: list[StrictInt] | None = Field(
        default=None,
        min_length=1,
        max_length=100_000,
        description="the corrected selection: these notes of the job's tenant",
    )
    all: StrictBool = Field(
        default=False, description="the corrected selection: every note of the job's tenant"
    )

    def correction(self) -> Correction | None:
        """The library's :class:`~exportcore.replays.Correction`; None when nothing is
        corrected."""
        if self.format is None and self.note_ids is None and not self.all:
            return None
        return Correction(
            format=ExportFormat(self.format) if self.format else None,
            note_ids=tuple(self.note_ids) if self.note_ids is not None else None,
            select_all=self.all,
        )


class BulkReplayCreate(BaseModel):
    """Replay every open dead letter with ``reason`` (optionally of one tenant), at most
    ``limit`` of them, oldest first."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(pattern=r"^[a-z0-9_]{1,100}$", description="the dead letters' reason")
    tenant: str | None = Field(
        default=None, pattern=r"^[a-z0-9][a-z0-9-]{0,62}$", description="only this tenant"
    )
    limit: StrictInt = Field(default=100, ge=1, le=1000)


class BulkReplayItem(BaseModel):
    """One dead letter a bulk replay reached."""

    dead_letter_id: int
    job_id: UUID
    replay_id: UUID | None = None
    detail: str | None = None


class BulkReplayRefusal(BulkReplayItem):
    """Where admission control stopped a bulk replay."""

    code: str
    retry_after: int


class BulkReplayOut(BaseModel):
    """What a bulk replay did: ``created`` new replays, ``existing`` replays found (another
    run, or an earlier request, wrote them), ``skipped`` jobs that cannot be replayed, the
    admission ``refused`` that stopped it (if any), and whether open ones remain (``more``)."""

    reason: str
    created: list[BulkReplayItem]
    existing: list[BulkReplayItem]
    skipped: list[BulkReplayItem]
    refused: BulkReplayRefusal | None
    more: bool
    bulk_id: int | None = Field(
        default=None, description="the bulk action this was (GET /v1/admin/bulk-actions/{id})"
    )


class AdminExportOut(ExportOut):
    """An export as operators see it: its tenant, the recorded error detail, the storage
    key of its result, and how often it was dispatched."""

    tenant_id: str
    result_ref: str | None
    dispatch_count: int


def admin_export_out(job: Row, base_url: str = "") -> AdminExportOut:
    """Render a job row for operators (:class:`AdminExportOut`)."""
    out = export_out(job, base_url, operator=True)
    return AdminExportOut(
        **out.model_dump(),
        tenant_id=job["tenant_id"],
        result_ref=job["result_ref"],
        dispatch_count=job["dispatch_count"],
    )


class AdminExportPage(BaseModel):
    """One page of any tenant's exports, newest first; pass ``next_cursor`` as ``cursor``."""

    items: list[AdminExportOut]
    next_cursor: str | None


class ExportPage(BaseModel):
    """One page of the caller's exports, newest first; pass ``next_cursor`` as ``cursor``."""

    items: list[ExportOut]
    next_cursor: str | None
