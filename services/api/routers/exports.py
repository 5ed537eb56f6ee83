"""``/v1/exports``: submit, status, history and download of export jobs (tenant-scoped)."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Annotated, Any, BinaryIO, Literal, TypeVar
from uuid import UUID

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from exportcore import encryption
from exportcore.admission import AdmissionRefused
from exportcore.artifacts import ArtifactStore, record_missing
from exportcore.cancel import request_cancel
from exportcore.domain import (
    TAGS_MAX,
    ArtifactMissing,
    ExportError,
    ExportFormat,
    ExportRequest,
    InvalidLabels,
    JobNotFound,
    JobNotReady,
    labels_filter,
    parse_idempotency_key,
    status_words,
)
from exportcore.settings import Settings
from exportcore.store import checkpoints as checkpoint_store
from exportcore.store import dispatch_pauses as pause_store
from exportcore.store import envelopes as envelope_store
from exportcore.store import jobs as job_store
from exportcore.submit import submit_export
from services.api.deps import (
    CoalescerDep,
    PoolDep,
    Reader,
    ReadRateLimited,
    SettingsDep,
    StoreDep,
    SubmitRateLimited,
    Writer,
    actor_of,
    count_refusal,
)
from services.api.problems import problem_responses
from services.api.schemas import (
    EventOut,
    ExportCreate,
    ExportOut,
    ExportPage,
    export_out,
    tenant_event,
)

log = logging.getLogger(__name__)
_K = TypeVar("_K")

router = APIRouter(prefix="/v1/exports", tags=["exports"])

_COMMON = problem_responses(401, 403, 404, 503)


REPLAYED_HEADER = "Idempotent-Replayed"
ENCRYPTED_MEDIA_TYPE = "application/octet-stream"
"""The media type of an encrypted export's download (an age file has no registered one)."""

# Every answer of the download route (file, 304, redirect; problems get them from
# services.api.headers): never cached, never sniffed into another type.
DOWNLOAD_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


@router.post(
    "",
    status_code=202,
    response_model=ExportOut,
    responses={
        202: {
            "description": "Accepted (committed). With a repeated Idempotency-Key: the "
            f"original export, and the header `{REPLAYED_HEADER}: true`.",
            "headers": {"Location": {"schema": {"type": "string"}}},
        },
        **problem_responses(400, 401, 403, 409, 413, 415, 422, 429, 503),
    },
    summary="Accept an export (202 once committed)",
)
def create_export(
    body: ExportCreate,
    caller: Writer,
    _rate: SubmitRateLimited,
    pool: PoolDep,
    settings: SettingsDep,
    coalescer: CoalescerDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="optional; the same key and request within the retention return the "
            "original export instead of a new one (IETF draft 'The Idempotency-Key HTTP "
            "Header Field'): a quoted RFC 8941 string or a bare key of visible ASCII without "
            "spaces, quotes or backslashes, 1-255 characters; else 400",
        ),
    ] = None,
) -> JSONResponse:
    """Accept the export and answer 202 with its status URL in ``Location``.

    The answer is sent only after the job, its snapshot and its outbox event committed and
    admission control let it in (429 over the tenant's quota, 503 over global capacity,
    both with ``Retry-After`` and nothing written). Before all that, the tenant's submit rate
    limit (429 ``rate_limited`` with ``Retry-After`` from its token bucket).
    """
    request = ExportRequest.build(
        ExportFormat(body.format),
        body.note_ids,
        body.all,
        body.since,
        labels=body.labels(),
        recipients=body.recipients,
    )
    key = parse_idempotency_key(idempotency_key) if idempotency_key is not None else None
    try:
        submitted = submit_export(
            pool,
            settings,
            tenant_id=caller.tenant_id,
            request=request,
            idempotency_key=key,
            coalescer=coalescer,
        )
    except AdmissionRefused as exc:
        count_refusal(settings, caller.tenant_id, exc)
        raise
    out = export_out(submitted.job, settings.api_public_url)
    if log.isEnabledFor(logging.DEBUG):  # INFO: the access log's one line per request
        log.debug(
            "export replayed (idempotency key)" if submitted.replayed else "export accepted",
            extra={
                "job_id": str(out.id),
                "tenant_id": caller.tenant_id,
                "queue": out.queue,
                "notes": out.note_count,
            },
        )
    headers = {"Location": out.links.self}
    if submitted.replayed:
        headers[REPLAYED_HEADER] = "true"
    return JSONResponse(out.model_dump(mode="json"), status_code=202, headers=headers)


class InvalidCursor(ExportError):
    """The pagination cursor was not produced by this API."""

    code = "invalid_cursor"
    title = "Invalid cursor"


def _encode_cursor(created_at: datetime, key: UUID | int) -> str:
    raw = json.dumps({"c": created_at.isoformat(), "i": str(key)}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    at, key = _decode_keyset(cursor)
    return at, _parse_cursor_key(UUID, key)


def _decode_keyset(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
        return datetime.fromisoformat(data["c"]), str(data["i"])
    except (binascii.Error, ValueError, KeyError, TypeError) as exc:
        raise InvalidCursor(
            "the cursor is not valid; use next_cursor from a previous page"
        ) from exc


def _parse_cursor_key(kind: Callable[[str], _K], key: str) -> _K:
    try:
        return kind(key)
    except ValueError as exc:
        raise InvalidCursor("the cursor is not valid; use the link of a previous page") from exc


EVENTS_PAGE = 1000
"""Most history events one answer holds (``limit`` default and maximum)."""
EventsLimit = Annotated[int, Query(ge=1, le=EVENTS_PAGE, description="events per answer")]
EventsCursor = Annotated[
    str | None, Query(max_length=200, description="from the previous page's Link header")
]


def events_page(
    conn: Any, request: Request, job_id: UUID, limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """One page of ``job_id``'s history (at most ``limit`` events after ``cursor``) and the
    answer's headers: ``Link: <…>; rel="next"`` (RFC 8288) when more events follow. The
    answer stays a JSON array (the first page of a short history is the whole of it)."""
    after = None
    if cursor:
        at, key = _decode_keyset(cursor)
        after = (at, _parse_cursor_key(int, key))
    rows = job_store.job_events(conn, job_id=job_id, limit=limit + 1, after=after)
    headers: dict[str, str] = {}
    if len(rows) > limit:
        rows = rows[:limit]
        token = _encode_cursor(rows[-1]["at"], rows[-1]["id"])
        headers["Link"] = f'<{request.url.path}?limit={limit}&cursor={token}>; rel="next"'
    return rows, headers


METADATA_QUERY = re.compile(r"metadata\[([^\[\]]*)\]")
"""A metadata filter's query parameter: ``metadata[key]`` (OpenAPI ``deepObject`` style)."""
METADATA_QUERY_PARAMETER = {
    "name": "metadata",
    "in": "query",
    "style": "deepObject",
    "explode": True,
    "required": False,
    "description": "only exports whose metadata has these pairs: metadata[key]=value, "
    "repeatable with other keys",
    "schema": {"type": "object", "additionalProperties": {"type": "string"}},
}


def metadata_query(request: Request) -> dict[str, str]:
    """The ``metadata[key]=value`` pairs of a list request's query string (each key once).
    Raises :class:`~exportcore.domain.InvalidLabels` (422) for a ``metadata…`` parameter
    of another shape and for a key asked twice, naming the parameter."""
    out: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if not name.startswith("metadata"):
            continue
        match = METADATA_QUERY.fullmatch(name)
        if match is None:
            raise InvalidLabels(
                f"query parameter {name!r}: a metadata filter is metadata[key]=value",
                errors=[
                    {
                        "loc": ["query", name],
                        "msg": "expected metadata[key]",
                        "type": "invalid_labels",
                    }
                ],
            )
        key = match.group(1)
        if key in out and out[key] != value:
            raise InvalidLabels(
                f"query parameter {name!r} is given twice with different values; an export "
                "has one value per key",
                errors=[
                    {"loc": ["query", name], "msg": "one value per key", "type": "invalid_labels"}
                ],
            )
        out[key] = value
    return out


StatusQuery = Annotated[
    Literal["queued", "running", "succeeded", "failed", "cancelled"] | None,
    Query(description="only exports in this state"),
]
LimitQuery = Annotated[int, Query(ge=1, le=500, description="exports per page")]
CursorQuery = Annotated[
    str | None, Query(max_length=200, description="next_cursor of the previous page")
]
TagQuery = Annotated[
    list[str] | None,
    Query(
        max_length=TAGS_MAX,
        description="only exports with this tag; repeat it for exports with every one",
    ),
]
"""The query parameters of an export list (the tenant's and the operators')."""


@router.get(
    "",
    response_model=ExportPage,
    responses=problem_responses(400, 401, 403, 422, 429, 503),
    summary="List the caller's exports, newest first",
    openapi_extra={"parameters": [METADATA_QUERY_PARAMETER]},
)
def list_exports(
    request: Request,
    caller: Reader,
    _rate: ReadRateLimited,
    pool: PoolDep,
    settings: SettingsDep,
    status: StatusQuery = None,
    limit: LimitQuery = 50,
    cursor: CursorQuery = None,
    tag: TagQuery = None,
) -> ExportPage:
    """Keyset (cursor) pagination: stable while new exports arrive. ``tag=a&tag=b`` and
    ``metadata[key]=value`` (repeatable) keep the exports that carry every tag and pair
    asked (docs/api.md "Metadata and tags")."""
    before = _decode_cursor(cursor) if cursor else None
    labels = labels_filter(metadata_query(request), tag)
    with pool.connection() as conn:
        rows = job_store.job_list_for_tenant(
            conn,
            tenant_id=caller.tenant_id,
            limit=limit + 1,
            status=status,
            before=before,
            labels=labels,
        )
    page = rows[:limit]
    next_cursor = (
        _encode_cursor(page[-1]["created_at"], page[-1]["id"]) if len(rows) > limit else None
    )
    return ExportPage(
        items=[export_out(r, settings.api_public_url) for r in page], next_cursor=next_cursor
    )


@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=ExportOut,
    responses=problem_responses(401, 403, 404, 409, 503),
    summary="Cancel an export",
)
def cancel_export(
    job_id: UUID, caller: Writer, pool: PoolDep, settings: SettingsDep
) -> JSONResponse:
    """Ask to cancel; 202 with the job as it is now.

    A queued export is cancelled at once (``status: cancelled``). A running export shows
    ``cancel_requested: true`` and stays ``running`` until its worker stops at the next
    chunk boundary; only then does it become ``cancelled``. 409 for a finished export.
    """
    job = request_cancel(pool, tenant_id=caller.tenant_id, job_id=job_id, actor=actor_of(caller))
    return JSONResponse(
        export_out(job, settings.api_public_url).model_dump(mode="json"), status_code=202
    )


@router.get("/{job_id}", response_model=ExportOut, responses=_COMMON, summary="Export status")
def get_export(job_id: UUID, caller: Reader, pool: PoolDep, settings: SettingsDep) -> ExportOut:
    """Status, attempts, timestamps, error and (when succeeded) the result of one export; a
    delta's base; a bulk export's checkpoint while it is queued or running; while it is
    queued, whether an operator's dispatch pause holds it (``dispatch_paused``)."""
    with pool.connection() as conn:
        job = job_store.job_get(conn, job_id=job_id, tenant_id=caller.tenant_id)
        progress = (
            checkpoint_store.checkpoint_progress(conn, job_id=job_id)
            if job is not None and job["status"] in ("queued", "running")
            else None
        )
        paused = (
            pause_store.dispatch_pause_covers(conn, queue=job["queue"], tenant_id=caller.tenant_id)
            if job is not None and job["status"] == "queued"
            else None
        )
    if job is None:
        raise JobNotFound(f"no export {job_id}")
    return export_out(job, settings.api_public_url, checkpoint=progress, dispatch_paused=paused)


@router.get(
    "/{job_id}/events",
    response_model=list[EventOut],
    responses={
        200: {
            "description": "One page of the history, oldest first; when more follow, a "
            '`Link: <…>; rel="next"` header (RFC 8288) names the next page',
            "headers": {"Link": {"schema": {"type": "string"}}},
        },
        **problem_responses(400, 401, 403, 404, 422, 429, 503),
    },
    summary="Export history",
)
def get_export_events(
    job_id: UUID,
    request: Request,
    caller: Reader,
    _rate: ReadRateLimited,
    pool: PoolDep,
    limit: EventsLimit = EVENTS_PAGE,
    cursor: EventsCursor = None,
) -> JSONResponse:
    """The job's append-only history, oldest first, without internals (lease tokens,
    message ids, storage keys, error details: operators read them in
    ``/v1/admin/exports/{id}/events``), at most ``limit`` events per answer."""
    with pool.connection() as conn:
        if job_store.job_get(conn, job_id=job_id, tenant_id=caller.tenant_id) is None:
            raise JobNotFound(f"no export {job_id}")
        rows, headers = events_page(conn, request, job_id, limit, cursor)
    body = [tenant_event(r).model_dump(mode="json") for r in rows]
    return JSONResponse(body, headers=headers)


@router.get(
    "/{job_id}/download",
    responses={
        200: {
            "content": {
                **{f.media_type: {} for f in ExportFormat},
                ENCRYPTED_MEDIA_TYPE: {},
            },
            "description": "The artifact (an encrypted export: the age file, "
            f"{ENCRYPTED_MEDIA_TYPE}, named export-<id>.<ext>.age)",
        },
        304: {"description": "Not modified (If-None-Match matched the ETag)"},
        307: {
            "description": "DOWNLOAD_MODE=redirect with the S3 backend: `Location` is a "
            "presigned URL valid for PRESIGN_SECONDS; `ETag` is the artifact's SHA-256",
            "headers": {"Location": {"schema": {"type": "string"}}},
        },
        **problem_responses(401, 403, 404, 409, 410, 429, 503),
    },
    response_class=StreamingResponse,
    summary="Download the export",
)
def download_export(
    job_id: UUID,
    request: Request,
    caller: Reader,
    _rate: ReadRateLimited,
    pool: PoolDep,
    store: StoreDep,
    settings: SettingsDep,
) -> Response:
    """The artifact recorded by the winning finish, with its SHA-256 as ``ETag``.

    Streamed through the api (``DOWNLOAD_MODE=stream``, the default), or a 307 redirect to
    a short-lived presigned URL of the object (``DOWNLOAD_MODE=redirect`` on S3; the file
    backend always streams). 410 when the recorded artifact is gone from storage.
    """
    with pool.connection() as conn:
        job = job_store.job_get(conn, job_id=job_id, tenant_id=caller.tenant_id)
    if job is None:
        raise JobNotFound(f"no export {job_id}")
    return artifact_response(job, request, store, settings)


@router.get(
    "/{job_id}/envelope",
    responses=problem_responses(401, 403, 404, 429, 503),
    summary="An encrypted export's signed envelope",
)
def get_envelope(
    job_id: UUID, caller: Reader, _rate: ReadRateLimited, pool: PoolDep
) -> dict[str, Any]:
    """``{"envelope": {...}, "signature": {...} | null}`` of a succeeded encrypted export:
    the ciphertext's SHA-256 and size, its recipients and the inner manifest's identity,
    signed with the manifest key (docs/api.md "Encrypted exports"). 404 for an export that
    is not encrypted or not succeeded."""
    with pool.connection() as conn:
        row = envelope_store.envelope_get(conn, job_id=job_id, tenant_id=caller.tenant_id)
    if row is None:
        raise JobNotFound(
            f"no envelope for export {job_id}: it is not a succeeded encrypted export"
        )
    return {"envelope": row["header"], "signature": row["signature"]}


def artifact_response(
    job: dict[str, Any], request: Request, store: ArtifactStore, settings: Settings
) -> Response:
    """The download of a job's artifact (the tenant API's and the operator console's): 304
    for a matching ``If-None-Match``, a 307 to a presigned URL in redirect mode, else the
    stream with its SHA-256 as ``ETag``. Raises ``JobNotReady`` unless the job succeeded and
    ``ArtifactMissing`` when its artifact is gone from storage."""
    job_id = job["id"]
    if job["status"] != "succeeded":
        raise JobNotReady(
            f"export {job_id} {status_words(job['status'])}; only succeeded exports have a file"
        )
    etag = f'"{job["result_sha256"]}"'
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers={"ETag": etag, **DOWNLOAD_HEADERS})
    fmt = ExportFormat(job["format"])
    filename = f"export-{job_id}.{fmt.extension}"
    media_type = fmt.media_type
    if str(job["result_ref"]).endswith("." + encryption.EXTENSION):  # an age file
        filename, media_type = f"{filename}.{encryption.EXTENSION}", ENCRYPTED_MEDIA_TYPE
    try:
        if settings.download_mode == "redirect":
            url = store.presigned_url(
                job["result_ref"],
                expires_in=settings.presign_seconds,
                filename=filename,
                media_type=media_type,
            )
            if url is not None:
                return Response(
                    status_code=307,
                    headers={"Location": url, "ETag": etag, **DOWNLOAD_HEADERS},
                )
        stream, size = store.open_reader(job["result_ref"])
    except ArtifactMissing:
        record_missing(store.backend)
        log.warning(
            "the artifact of a succeeded export is missing",
            extra={
                "job_id": str(job_id),
                "tenant_id": job["tenant_id"],
                "key": job["result_ref"],
                "backend": store.backend,
            },
        )
        # the storage key is for operators (the log above); the tenant learns only this
        raise ArtifactMissing(
            f"the file of export {job_id} is gone from storage; submit the export again"
        ) from None
    return StreamingResponse(
        _chunks(stream),
        media_type=media_type,
        headers={
            "ETag": etag,
            "Content-Length": str(size),
            "Content-Disposition": f'attachment; filename="{filename}"',
            **DOWNLOAD_HEADERS,
        },
    )


def _chunks(stream: BinaryIO, size: int = 1 << 16) -> Iterator[bytes]:
    try:
        while chunk := stream.read(size):
            yield chunk
    finally:
        stream.close()
