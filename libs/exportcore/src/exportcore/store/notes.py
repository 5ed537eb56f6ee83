"""The notes source (``sql/notes.sql``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from exportcore.db import Conn, Row
from exportcore.sql import q


def note_upsert_by_path(
    conn: Conn,
    *,
    tenant_id: str,
    source_path: str,
    title: str,
    content: str,
    pinned: bool,
    updated_at: datetime,
) -> Row | None:
    """Insert or update the note imported from ``source_path``.

    Returns ``{id, inserted}``, or None when the stored note was already identical.
    """
    return conn.execute(
        q("notes", "note_upsert_by_path"),
        {
            "tenant_id": tenant_id,
            "source_path": source_path,
            "title": title,
            "content": content,
            "pinned": pinned,
            "updated_at": updated_at,
        },
    ).fetchone()


def notes_existing_ids(conn: Conn, *, tenant_id: str, note_ids: Sequence[int]) -> set[int]:
    """The subset of ``note_ids`` that are notes of ``tenant_id``."""
    row = conn.execute(
        q("notes", "notes_existing_ids"), {"tenant_id": tenant_id, "note_ids": list(note_ids)}
    ).fetchone()
    return set(row["ids"]) if row else set()


def notes_count(conn: Conn, *, tenant_id: str) -> int:
    """How many notes the tenant has."""
    row = conn.execute(q("notes", "notes_count"), {"tenant_id": tenant_id}).fetchone()
    return int(row["n"]) if row else 0


def notes_page(conn: Conn, *, tenant_id: str, limit: int, after: int | None) -> list[Row]:
    """Up to ``limit`` notes of ``tenant_id`` with an id above ``after`` (None: from the
    first), by id: ``{id, title, source_path, pinned, bytes, updated_at, created_at}``
    (``bytes``: the content's size in UTF-8 bytes; the content itself is never read)."""
    return conn.execute(
        q("notes", "notes_page"), {"tenant_id": tenant_id, "limit": limit, "after": after}
    ).fetchall()


def notes_delete_many(conn: Conn, *, tenant_id: str, note_ids: Sequence[int]) -> list[int]:
    """Delete notes of ``tenant_id`` by id (each leaves a tombstone); the ids deleted."""
    rows = conn.execute(
        q("notes", "notes_delete_many"), {"tenant_id": tenant_id, "note_ids": list(note_ids)}
    ).fetchall()
    return [int(r["id"]) for r in rows]


def notes_delete_not_in_paths(conn: Conn, *, tenant_id: str, paths: Sequence[str]) -> list[int]:
    """Delete the tenant's imported notes whose source path is not in ``paths`` (each
    leaves a tombstone); the ids deleted."""
    rows = conn.execute(
        q("notes", "notes_delete_not_in_paths"), {"tenant_id": tenant_id, "paths": list(paths)}
    ).fetchall()
    return [int(r["id"]) for r in rows]


def note_versions_prune_mark(conn: Conn, *, limit: int) -> list[tuple[int, int]]:
    """At most ``limit`` superseded versions no job that may still render names, as
    ``(note_id, version)`` (step 1 of :class:`exportcore.note_versions.VersionPruner`)."""
    rows = conn.execute(q("notes", "note_versions_prune_mark"), {"limit": limit}).fetchall()
    return [(int(r["note_id"]), int(r["version"])) for r in rows]


def note_versions_prune_in_progress(conn: Conn) -> list[tuple[int, datetime]]:
    """Every transaction in progress in this database but the caller's, as
    ``(pid, xact_start)``; call it after :func:`note_versions_prune_mark`, in a later
    statement."""
    rows = conn.execute(q("notes", "note_versions_prune_in_progress")).fetchall()
    return [(int(r["pid"]), r["xact_start"]) for r in rows]


def note_versions_prune_waiting(
    conn: Conn, *, transactions: Sequence[tuple[int, datetime]]
) -> tuple[int, int]:
    """``(still in progress among transactions, prepared transactions of the database)``."""
    row = conn.execute(
        q("notes", "note_versions_prune_waiting"),
        {"pids": [t[0] for t in transactions], "starts": [t[1] for t in transactions]},
    ).fetchone()
    assert row is not None
    return int(row["waiting"]), int(row["prepared"])


def note_versions_prune_sweep(conn: Conn, *, versions: Sequence[tuple[int, int]]) -> int:
    """Delete those of ``versions`` (``(note_id, version)``) still named by no job that may
    render; returns how many were deleted."""
    row = conn.execute(
        q("notes", "note_versions_prune_sweep"),
        {"note_ids": [v[0] for v in versions], "versions": [v[1] for v in versions]},
    ).fetchone()
    return int(row["n"]) if row else 0
