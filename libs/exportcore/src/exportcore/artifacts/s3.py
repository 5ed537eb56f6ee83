"""The ``s3://bucket/prefix`` backend: AWS S3, MinIO and other S3-compatible stores (boto3).

Atomic visibility: nothing is written under a key until the artifact is complete. A writer
spools up to ``multipart_threshold`` bytes in memory; an artifact that stays that small is
sent with one ``PutObject`` at commit. A larger one becomes a multipart upload: parts of
``part_size`` bytes are uploaded as they fill (memory stays bounded by about
``max(threshold, part size) + part size`` whatever the artifact's size), and the object
appears under its key only when ``CompleteMultipartUpload`` succeeds at commit. An abort
(or any error before commit) aborts the multipart upload; an upload whose writer died is
listed (``complete=False``) so that orphan cleanup aborts it, and ``delete(key)`` removes
both the object and any unfinished upload of that key.

Only keys with the artifact key shape under the configured prefix are ever listed or
deleted, so the bucket may hold other data.

Bounds (a worker's store): every call takes a token of the deployment's ``storage`` bucket
first (:mod:`exportcore.downstream`), and a writer bound to a job's deadline makes each
call through a client whose connect and read timeouts are at most the time left, with one
attempt (:meth:`S3ArtifactStore.client`), so no upload outlives the job's deadline by a
socket timeout (:mod:`exportcore.deadlines`).
"""

from __future__ import annotations

import io
import logging
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, cast
from uuid import UUID

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from exportcore.artifacts.base import (
    ArtifactEntry,
    ArtifactStore,
    ArtifactWriter,
    CheckpointUntrusted,
    DurablePrefix,
    is_artifact_key,
    key_prefix,
    validate_key,
)
from exportcore.artifacts.location import ArtifactLocation, normalise_prefix, validate_bucket
from exportcore.domain import ArtifactMissing, ExportFormat
from exportcore.downstream import STORAGE
from exportcore.failures import PermanentError, TransientError

if TYPE_CHECKING:
    from exportcore.deadlines import Deadline
    from exportcore.downstream import DownstreamLimiter
    from exportcore.settings import Settings

log = logging.getLogger(__name__)

MiB = 1024 * 1024
MIN_PART_SIZE = 5 * MiB
"""S3's smallest part (every part but the last)."""
MAX_PART_SIZE = 5 * 1024 * MiB
"""S3's largest part, and its largest single PUT."""
MAX_PARTS = 10_000

DEADLINE_TIERS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
"""Timeouts (seconds) of the clients used near a job's deadline (a few clients per
process, created on first use)."""
EXPECT_WAIT = 1.0
"""botocore's own wait for ``100 Continue`` before it sends an upload's body (fixed, not a
configured timeout): part of what one call may take."""

_NOT_FOUND = frozenset({"NoSuchKey", "404", "NotFound"})
_PREFIX_GONE = _NOT_FOUND | {"NoSuchUpload", "InvalidPart", "InvalidPartOrder"}
"""Errors that say a checkpoint's upload or prefix object is gone or not what it recorded
(the checkpoint is discarded); any other error is the store's trouble (the job retries and
the checkpoint stays)."""
_FILENAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
_MEDIA_TYPES = {f.extension: f.media_type for f in ExportFormat}

AddressingStyle = Literal["auto", "path", "virtual"]


@dataclass(frozen=True)
class S3Config:
    """Everything the S3 backend needs; secrets are kept out of ``repr``."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    presign_endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    addressing_style: AddressingStyle = "auto"
    multipart_threshold: int = 8 * MiB
    part_size: int = 8 * MiB
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    max_attempts: int = 3

    def __post_init__(self) -> None:
        validate_bucket(self.bucket)
        if normalise_prefix(self.prefix) != self.prefix:
            raise ValueError(f"the key prefix {self.prefix!r} is not normalised")
        if not MIN_PART_SIZE <= self.part_size <= MAX_PART_SIZE:
            raise ValueError(f"part size must be between {MIN_PART_SIZE} and {MAX_PART_SIZE}")
        if not 0 <= self.multipart_threshold <= MAX_PART_SIZE:
            raise ValueError(f"multipart threshold must be between 0 and {MAX_PART_SIZE}")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("give both the access key id and the secret access key, or neither")

    @classmethod
    def from_settings(cls, settings: Settings, location: ArtifactLocation) -> S3Config:
        """The backend configuration from ``settings`` for an ``s3://`` ``location``."""
        secret = settings.s3_secret_access_key
        return cls(
            bucket=location.bucket,
            prefix=location.prefix,
            endpoint_url=settings.s3_endpoint_url or None,
            presign_endpoint_url=settings.s3_presign_endpoint_url or None,
            region=settings.s3_region or None,
            access_key_id=settings.s3_access_key_id or None,
            secret_access_key=secret.get_secret_value() if secret is not None else None,
            addressing_style=settings.s3_addressing_style,
            multipart_threshold=settings.s3_multipart_threshold,
            part_size=settings.s3_multipart_part_size,
            connect_timeout=settings.s3_connect_timeout,
            read_timeout=settings.s3_read_timeout,
            max_attempts=settings.s3_max_attempts,
        )


def error_code(exc: ClientError) -> str:
    """The S3 error code of a ClientError (``NoSuchKey``, ``SlowDown``, ``404``...)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


class _BodyReader(io.RawIOBase):
    """A botocore ``StreamingBody`` as a raw binary stream (wrapped in a BufferedReader)."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        data = self._body.read(len(view))
        n = len(data)
        view[:n] = data
        return n

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


class _S3Writer(ArtifactWriter):
    def __init__(self, store: S3ArtifactStore, key: str) -> None:
        super().__init__(key)
        self._store = store
        self._bucket = store.config.bucket
        self._object_key = store.object_key(key)
        self._content_type = _MEDIA_TYPES.get(key.rsplit(".", 1)[-1], "application/octet-stream")
        self._threshold = store.config.multipart_threshold
        self._part_size = store.config.part_size
        self._buf = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._drain_at = self._part_size

    @property
    def upload_id(self) -> str | None:
        """The multipart upload in progress, if one was started."""
        return self._upload_id

    @property
    def parts_uploaded(self) -> int:
        """Parts already sent to the store."""
        return len(self._parts)

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        # Take only what fits: up to the threshold while spooling, then exactly up to the
        # next part boundary, so that the buffer never grows past max(threshold, part) and
        # a full part is handed to the client without a copy.
        while len(view):
            if self._upload_id is None:
                room = self._threshold + 1 - len(self._buf)
            else:
                room = self._drain_at - len(self._buf)
            room = max(room, 1)
            self._buf += view[:room]
            view = view[room:]
            self._drain()

    def _drain(self) -> None:
        if self._upload_id is None:
            if len(self._buf) <= self._threshold:
                return
            self._start_upload()
            log.debug("multipart upload started", extra={"key": self.key})
        # A checkpointed write (sync called) keeps up to two parts for a chunk boundary,
        # where the whole buffer becomes one part, so that durable prefixes end where a
        # chunk of notes ends; a plain write sends each part as soon as it is full.
        while len(self._buf) >= self._drain_at:
            self._upload_part(self._part_size)

    def _start_upload(self) -> None:
        """Create this object's multipart upload; its id goes in ``_upload_id``."""
        resp = self._call(
            "create_multipart_upload",
            Bucket=self._bucket,
            Key=self._object_key,
            ContentType=self._content_type,
        )
        self._upload_id = str(resp["UploadId"])

    def sync(self, min_bytes: int) -> DurablePrefix | None:
        """Upload the whole buffer as one part once it holds a part's worth (and at least
        ``min_bytes``): the parts then end exactly where the bytes written so far end, and
        that prefix (upload id, parts with ETags) is what a checkpoint records."""
        self._drain_at = 2 * self._part_size
        if len(self._buf) < max(self._part_size, min_bytes):
            return None
        if self._upload_id is None:
            self._start_upload()
        self._upload_part(len(self._buf))
        return self._prefix(
            upload_id=self._upload_id,
            parts=tuple((p["PartNumber"], p["ETag"], p["Size"]) for p in self._parts),
        )

    def _release(self) -> None:
        self._buf = bytearray()
        self._upload_id = None

    def _upload_part(self, size: int) -> None:
        if len(self._parts) >= MAX_PARTS:
            raise PermanentError(
                "artifact_too_large",
                f"the artifact needs more than {MAX_PARTS} parts of {self._part_size} bytes; "
                "raise S3_MULTIPART_PART_SIZE",
            )
        body: bytes | bytearray
        if size == len(self._buf):
            body, self._buf = self._buf, bytearray()
        else:
            body = bytes(memoryview(self._buf)[:size])
            del self._buf[:size]
        number = len(self._parts) + 1
        resp = self._call(
            "upload_part",
            Bucket=self._bucket,
            Key=self._object_key,
            UploadId=self._upload_id,
            PartNumber=number,
            Body=body,
        )
        self._parts.append({"PartNumber": number, "ETag": resp["ETag"], "Size": len(body)})

    def _call(self, operation: str, **kwargs: Any) -> Any:
        """One S3 call of this writer: a token of the storage bucket, then the call through
        a client bounded by the writer's deadline."""
        self._store.acquire(self.deadline)
        return getattr(self._store.client(self.deadline), operation)(**kwargs)

    def _commit(self) -> str | None:
        if self._upload_id is None:
            resp = self._call(
                "put_object",
                Bucket=self._bucket,
                Key=self._object_key,
                Body=bytes(self._buf),
                ContentType=self._content_type,
            )
        else:
            if self._buf or not self._parts:
                self._upload_part(len(self._buf))
            resp = self._call(
                "complete_multipart_upload",
                Bucket=self._bucket,
                Key=self._object_key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": _listed(self._parts)},
            )
            self._upload_id = None  # completed: nothing left to abort
        self._buf = bytearray()
        etag = resp.get("ETag")
        return str(etag).strip('"') if etag else None

    def _abort(self) -> None:
        self._buf = bytearray()
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is None:
            return
        try:  # not bound by the deadline: an abort cleans up, late or not
            self._store.acquire()
            self._store.client().abort_multipart_upload(
                Bucket=self._bucket, Key=self._object_key, UploadId=upload_id
            )
        except (BotoCoreError, ClientError, TransientError) as exc:
            log.warning(
                "could not abort a multipart upload; orphan cleanup will",
                extra={"key": self.key, "error": type(exc).__name__},
            )
            return
        log.info("multipart upload aborted", extra={"key": self.key, "parts": len(self._parts)})


def _listed(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The parts as CompleteMultipartUpload takes them (number and ETag)."""
    return [{"PartNumber": p["PartNumber"], "ETag": p["ETag"]} for p in parts]


class S3ArtifactStore(ArtifactStore):
    """Artifacts as objects ``<prefix>/<tenant>/<job id>/<lease token>.<ext>`` in a bucket.

    The boto3 client is created on first use in each process (never inherited across
    ``fork``, e.g. by Celery prefork children or gunicorn workers) and shared by threads.
    """

    backend = "s3"

    def __init__(self, config: S3Config, downstream: DownstreamLimiter | None = None) -> None:
        self.config = config
        self.downstream = downstream
        self._root = f"{config.prefix}/" if config.prefix else ""
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._api: Any = None
        self._presigner: Any = None
        self._bounded: dict[float, Any] = {}

    def __repr__(self) -> str:
        return f"S3ArtifactStore(s3://{self.config.bucket}/{self.config.prefix})"

    # --- clients ------------------------------------------------------------------------

    def _new_client(
        self, endpoint_url: str | None, timeout: float | None = None, attempts: int | None = None
    ) -> Any:
        cfg = self.config
        connect = cfg.connect_timeout if timeout is None else min(cfg.connect_timeout, timeout)
        session = boto3.session.Session()
        return session.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=cfg.region,
            aws_access_key_id=cfg.access_key_id,
            aws_secret_access_key=cfg.secret_access_key,
            config=Config(
                signature_version="s3v4",
                s3={"addressing_style": cfg.addressing_style},
                connect_timeout=connect,
                read_timeout=cfg.read_timeout if timeout is None else timeout,
                retries={"mode": "standard", "total_max_attempts": attempts or cfg.max_attempts},
            ),
        )

    def _clients(self) -> tuple[Any, Any]:
        with self._lock:
            if self._pid != os.getpid():
                self._api = self._presigner = None
                self._bounded = {}
                self._pid = os.getpid()
            if self._api is None:
                self._api = self._new_client(self.config.endpoint_url)
                presign_endpoint = self.config.presign_endpoint_url
                self._presigner = (
                    self._new_client(presign_endpoint) if presign_endpoint else self._api
                )
            return self._api, self._presigner

    def client(self, deadline: Deadline | None = None) -> Any:
        """This process's boto3 S3 client; with a job's ``deadline`` close enough that a
        call with the configured timeouts and attempts could outlive it (attempts x
        (connect + :data:`EXPECT_WAIT` + read timeout)), a client with one attempt whose
        connect and read timeouts are the largest of :data:`DEADLINE_TIERS` for which
        connect + :data:`EXPECT_WAIT` + read fits in the time left (the smallest tier when
        none does). Raises ``DeadlineExceeded`` with less than the smallest tier left."""
        api = self._clients()[0]
        if deadline is None:
            return api
        cfg = self.config
        worst = cfg.max_attempts * (cfg.connect_timeout + EXPECT_WAIT + cfg.read_timeout)
        left = deadline.bound(worst, "a storage call", least=DEADLINE_TIERS[0])
        if left >= worst:
            return api
        fitting = [t for t in DEADLINE_TIERS if 2 * t + EXPECT_WAIT <= left]
        tier = max(fitting, default=DEADLINE_TIERS[0])
        with self._lock:
            client = self._bounded.get(tier)
            if client is None:
                client = self._bounded[tier] = self._new_client(
                    cfg.endpoint_url, timeout=tier, attempts=1
                )
        return client

    def acquire(self, deadline: Deadline | None = None) -> None:
        """Take a token of the deployment's storage bucket before a call (a worker's store;
        others have no limiter). Raises ``DownstreamThrottled`` when none comes in time."""
        if self.downstream is not None:
            self.downstream.acquire(STORAGE, deadline)

    # --- keys ---------------------------------------------------------------------------

    def object_key(self, key: str) -> str:
        """The bucket key of artifact ``key`` (validated)."""
        return self._root + validate_key(key)

    def _artifact_key(self, object_key: str) -> str | None:
        if not object_key.startswith(self._root):
            return None
        key = object_key[len(self._root) :]
        return key if is_artifact_key(key) else None

    # --- the store ----------------------------------------------------------------------

    def open_writer(self, key: str) -> ArtifactWriter:
        return _S3Writer(self, key)

    def resume_writer(
        self, key: str, prefix: DurablePrefix
    ) -> tuple[ArtifactWriter, DurablePrefix]:
        """Take over another token's multipart upload: complete it with the recorded parts
        (the old holder can then add no part: fenced out; a part it replaced after the
        checkpoint fails the completion's ETag check), read the object back to re-hash it
        against the recorded SHA-256, and copy its parts server-side (UploadPartCopy) into
        a new upload under ``key``. The completed old object is removed by
        :meth:`drop_prefix` once the checkpoint names the new upload."""
        if prefix.upload_id is None or not prefix.parts:
            raise CheckpointUntrusted("layout", "the checkpoint names no multipart upload")
        client, bucket = self.client(), self.config.bucket
        old = self.object_key(prefix.key)
        try:
            self.acquire()
            client.complete_multipart_upload(
                Bucket=bucket,
                Key=old,
                UploadId=prefix.upload_id,
                MultipartUpload={
                    "Parts": [{"PartNumber": n, "ETag": etag} for n, etag, _ in prefix.parts]
                },
            )
        except ClientError as exc:
            if error_code(exc) not in _PREFIX_GONE and self._upload_exists(old, prefix.upload_id):
                raise  # the store's trouble (throttling, 5xx): the checkpoint stays
            raise CheckpointUntrusted(
                "missing", f"the multipart upload cannot be completed ({error_code(exc)})"
            ) from None
        writer = _S3Writer(self, key)
        try:
            try:
                self.acquire()  # the read-back of the prefix
                stream, size = self.open_reader(prefix.key)
            except ArtifactMissing:
                raise CheckpointUntrusted("missing", "the completed prefix is gone") from None
            with stream:
                if size != prefix.nbytes:
                    raise CheckpointUntrusted("short", f"the upload holds {size} bytes")
                while block := stream.read(1 << 20):
                    writer._sha.update(block)
                    writer._size += len(block)
            if writer._sha.hexdigest() != prefix.sha256:
                raise CheckpointUntrusted("hash_mismatch", "the upload does not hash as recorded")
            self.acquire()
            resp = client.create_multipart_upload(
                Bucket=bucket, Key=writer._object_key, ContentType=writer._content_type
            )
            writer._upload_id = str(resp["UploadId"])
            writer._drain_at = 2 * writer._part_size
            first = 0
            for number, _, part_size in prefix.parts:
                self.acquire()
                copied = client.upload_part_copy(
                    Bucket=bucket,
                    Key=writer._object_key,
                    UploadId=writer._upload_id,
                    PartNumber=number,
                    CopySource={"Bucket": bucket, "Key": old},
                    CopySourceRange=f"bytes={first}-{first + part_size - 1}",
                )
                etag = copied["CopyPartResult"]["ETag"]
                writer._parts.append({"PartNumber": number, "ETag": etag, "Size": part_size})
                first += part_size
        except ClientError as exc:
            writer.abort()
            if error_code(exc) not in _PREFIX_GONE:
                raise
            raise CheckpointUntrusted(
                "missing", f"copying the prefix failed ({error_code(exc)})"
            ) from None
        except BaseException:
            writer.abort()
            raise
        durable = writer._prefix(
            upload_id=writer._upload_id,
            parts=tuple((p["PartNumber"], p["ETag"], p["Size"]) for p in writer._parts),
        )
        return writer, durable

    def _upload_exists(self, object_key: str, upload_id: str) -> bool:
        """Whether multipart upload ``upload_id`` of ``object_key`` is still in progress
        (``ListParts``), asked after a completion failed with an error that does not say
        the upload is gone. A stale holder that completed the upload itself and deleted the
        object after its refused finish leaves an upload id that some stores (moto) answer
        with a 500 instead of ``NoSuchUpload``; retrying such a takeover could never
        succeed. Any error but a gone upload counts as in progress (the store's trouble:
        the checkpoint stays)."""
        try:
            self.acquire()
            self.client().list_parts(
                Bucket=self.config.bucket, Key=object_key, UploadId=upload_id, MaxParts=1
            )
        except ClientError as exc:
            return error_code(exc) not in _PREFIX_GONE
        except BotoCoreError:
            return True
        return True

    def drop_prefix(self, prefix: DurablePrefix) -> None:
        try:
            self.delete(prefix.key)
        except (BotoCoreError, ClientError) as exc:
            log.warning(
                "could not delete a taken-over prefix; orphan cleanup will",
                extra={"key": prefix.key, "error": type(exc).__name__},
            )

    def open_reader(self, ref: str) -> tuple[BinaryIO, int]:
        object_key = self.object_key(ref)
        try:
            resp = self.client().get_object(Bucket=self.config.bucket, Key=object_key)
        except ClientError as exc:
            if error_code(exc) in _NOT_FOUND:
                raise ArtifactMissing(f"artifact {ref} is missing from storage") from exc
            raise
        stream = io.BufferedReader(_BodyReader(resp["Body"]), buffer_size=1 << 16)
        return cast(BinaryIO, stream), int(resp["ContentLength"])

    def _exists(self, object_key: str) -> bool:
        client = self.client()
        try:
            client.head_object(Bucket=self.config.bucket, Key=object_key)
        except ClientError as exc:
            if error_code(exc) not in _NOT_FOUND:
                raise
            # HEAD has no body: a missing bucket is a 404 too. Tell them apart (rare path).
            try:
                client.head_bucket(Bucket=self.config.bucket)
            except ClientError as bucket_exc:
                if error_code(bucket_exc) not in _NOT_FOUND:
                    raise
                raise ClientError(
                    {
                        "Error": {"Code": "NoSuchBucket", "Message": "bucket not found"},
                        "ResponseMetadata": {"HTTPStatusCode": 404},
                    },
                    "HeadBucket",
                ) from bucket_exc
            return False
        return True

    def _uploads(self, prefix: str) -> Iterator[dict[str, Any]]:
        paginator = self.client().get_paginator("list_multipart_uploads")
        for page in paginator.paginate(Bucket=self.config.bucket, Prefix=prefix):
            yield from page.get("Uploads", [])

    def delete(self, ref: str) -> bool:
        object_key = self.object_key(ref)
        client = self.client()
        removed = False
        self.acquire()
        if self._exists(object_key):
            self.acquire()
            client.delete_object(Bucket=self.config.bucket, Key=object_key)
            removed = True
        for upload in list(self._uploads(object_key)):
            if upload["Key"] != object_key:
                continue
            try:
                client.abort_multipart_upload(
                    Bucket=self.config.bucket, Key=object_key, UploadId=upload["UploadId"]
                )
            except ClientError as exc:
                if error_code(exc) != "NoSuchUpload":  # completed or aborted meanwhile
                    raise
                continue
            removed = True
        return removed

    def entries(
        self, tenant_id: str | None = None, job_id: UUID | None = None
    ) -> Iterator[ArtifactEntry]:
        prefix = self._root + key_prefix(tenant_id, job_id)
        paginator = self.client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.config.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                key = self._artifact_key(obj["Key"])
                if key is not None:
                    yield ArtifactEntry(key, _utc(obj["LastModified"]), complete=True)
        for upload in self._uploads(prefix):
            key = self._artifact_key(upload["Key"])
            if key is not None:
                yield ArtifactEntry(key, _utc(upload["Initiated"]), complete=False)

    def presigned_url(
        self, ref: str, *, expires_in: int, filename: str, media_type: str
    ) -> str | None:
        if not _FILENAME.fullmatch(filename):
            raise ValueError(f"unsafe download file name: {filename!r}")
        object_key = self.object_key(ref)
        if not self._exists(object_key):
            raise ArtifactMissing(f"artifact {ref} is missing from storage")
        _, presigner = self._clients()
        url = presigner.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": self.config.bucket,
                "Key": object_key,
                "ResponseContentDisposition": f'attachment; filename="{filename}"',
                "ResponseContentType": media_type,
            },
            ExpiresIn=expires_in,
        )
        return str(url)


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
