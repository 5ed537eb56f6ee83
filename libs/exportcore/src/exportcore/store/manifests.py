"""Manifests of rendered artifacts (``sql/manifests.sql``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from exportcore import manifests
from exportcore.db import Conn, Row
from exportcore.sql import q


def manifest_record_many(
    conn: Conn,
    *,
    job_ids: Sequence[UUID],
    lease_tokens: Sequence[UUID],
    sha256s: Sequence[str],
    key_ids: Sequence[str | None],
    notes: Sequence[int],
    tombstones: Sequence[int],
) -> list[Row]:
    """Record the manifests of a batch (arrays of one value per job); a row per manifest
    recorded (its job still ran under that token)."""
    return conn.execute(
        q("manifests", "manifest_record_many"),
        {
            "job_ids": list(job_ids),
            "lease_tokens": list(lease_tokens),
            "sha256s": list(sha256s),
            "key_ids": list(key_ids),
            "notes": list(notes),
            "tombstones": list(tombstones),
        },
    ).fetchall()


def record_manifests(conn: Conn, rendered: Sequence[tuple[Any, Any]]) -> None:
    """Record the manifest of each ``(job row, ended renderer)`` of a batch that can be a
    delta's base: an export of every note (``selects_all``). Others are not recorded, so
    the usual small export of chosen notes costs no statement (and no commit) more."""
    done = [
        (job, r)
        for job, r in rendered
        if r is not None and r.manifest is not None and job.selects_all
    ]
    if not done:
        return
    manifest_record_many(
        conn,
        job_ids=[job.id for job, _ in done],
        lease_tokens=[job.token for job, _ in done],
        sha256s=[manifests.manifest_sha256(r.manifest) for _, r in done],
        key_ids=[r.manifest["key_id"] for _, r in done],
        notes=[r.manifest["notes"] for _, r in done],
        tombstones=[r.manifest["tombstones"] for _, r in done],
    )
