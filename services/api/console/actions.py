"""The console's dead-letter and replay actions, as thin calls into the library.

Every change goes through :mod:`exportcore.replays`, the same code as the admin API
(``/v1/admin/exports/{id}/replay``, ``/v1/admin/dead-letters``): one replay per failed job,
the same admission control and outbox path, and the dead letter's state (``open`` →
``replayed`` | ``resolved``, with who and when) written in the same transaction as its audit
row. The operator is recorded as :attr:`services.api.console.sessions.Operator.actor`, as the
admin API records its caller. Bulk replays are bulk actions (:mod:`exportcore.bulk`,
``services/api/console/bulk.py``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from uuid import UUID

from psycopg_pool import ConnectionPool

from exportcore.audit import Actor
from exportcore.db import Conn, Row
from exportcore.domain import ExportFormat, InvalidSelection
from exportcore.replays import Correction, DeadLetterNotFound, DeadLetterResolved, replay_export
from exportcore.replays import resolve_dead_letter as _resolve
from exportcore.settings import Settings

log = logging.getLogger(__name__)


MAX_FORM_IDS = 100_000
"""Most note ids the corrected-selection field takes (the API's own bound)."""


def correction_from_form(form: Mapping[str, object]) -> Correction | None:
    """The corrected input of the replay form: ``format`` (empty: the original's) and
    ``selection`` = ``same`` | ``all`` | ``ids`` with ``note_ids`` (numbers separated by
    spaces, commas or new lines). None when nothing is corrected. Raises
    ``InvalidSelection`` for an unknown format or selection, or ids that are not numbers."""
    fmt = str(form.get("format") or "")
    selection = str(form.get("selection") or "same")
    if fmt and fmt not in {f.value for f in ExportFormat}:
        raise InvalidSelection(f"unknown format {fmt[:40]!r}")
    if selection not in ("same", "all", "ids"):
        raise InvalidSelection("choose the same selection, every note, or note ids")
    note_ids: tuple[int, ...] | None = None
    if selection == "ids":
        words = [w for w in re.split(r"[\s,]+", str(form.get("note_ids") or "")) if w]
        if not words or len(words) > MAX_FORM_IDS or not all(w.isdigit() for w in words):
            raise InvalidSelection(
                "give the corrected selection as note ids: whole numbers separated by spaces "
                "or commas"
            )
        note_ids = tuple(int(w) for w in words)
    if not fmt and selection == "same":
        return None
    return Correction(
        format=ExportFormat(fmt) if fmt else None,
        note_ids=note_ids,
        select_all=selection == "all",
    )


def replay_once(
    pool: ConnectionPool[Conn],
    settings: Settings,
    *,
    job_id: UUID,
    actor: Actor,
    correction: Correction | None = None,
) -> Row | None:
    """Replay the failed job ``job_id`` (with ``correction``: a corrected input) unless it
    already has a replay: returns the new job, or None when a replay existed (made by
    anyone, even concurrently; see :func:`exportcore.replays.replay_export`). Raises what
    ``replay_export`` raises (``AdmissionRefused``, ``JobNotFound``, ``JobStateConflict``,
    ``InvalidSelection``, ``UnknownNotes``)."""
    replayed = replay_export(pool, settings, original_id=job_id, actor=actor, correction=correction)
    return replayed.job if replayed.created else None


def resolve_dead_letter(
    pool: ConnectionPool[Conn], *, dead_letter_id: int, actor: Actor, note: str = ""
) -> bool:
    """Mark a dead letter ``resolved`` by ``actor`` (optional ``note``, at most 500
    characters); False when it is unknown or already resolved."""
    try:
        _resolve(pool, dead_letter_id=dead_letter_id, actor=actor, note=note[:500] or None)
    except (DeadLetterNotFound, DeadLetterResolved):
        log.info("console dead letter not resolved", extra={"dead_letter_id": dead_letter_id})
        return False
    return True
