"""Replay (redrive) of failed exports, once: "one effect, not two".

A replay is a NEW job with the failed job's snapshot and ``replay_of`` = the failed job,
through the normal outbox path and admission control; the failed job and its dead letter's
reason stay as they were, and the dead letter moves to ``replayed``.

Idempotence (docs/architecture.md, "Dead letters"):

- a failed job has at most one active (queued or running) replay. Asking again returns the
  existing replay (``created=False``) instead of writing a second job; so does asking after
  the replay succeeded, since its effect happened;
- concurrent requests for one job queue up on the job's row lock
  (``job_lock_for_replay``): the first writes the replay, the others find it. The unique
  index ``export_jobs_one_active_replay`` is the durable guard behind the lock;
- when the replay itself failed, asking again chains: the new job replays the failed replay
  (``replay_of`` = that replay), following the chain to its newest failed job. A cancelled
  replay does not count: the job it replayed may be replayed again.

Every replay goes through :func:`replay_in`, on the connection of the transaction that
writes it: :func:`replay_export` (one job, the admin API and the console) and the batches of
a bulk replay (:mod:`exportcore.bulk`). :func:`replay_export` is the one entry point of a
single replay and writes its audit row (``operator_actions``, :mod:`exportcore.audit`) in
that same transaction; a bulk replay is audited once, with its count. The history events of
a replay say who asked (``requested_by``: operator or tenant) and, for a bulk replay, which
one (``bulk_id``).

**Redrive with a corrected input.** A job that failed because of its input (a format that
cannot hold it, notes it should not have named) is replayed with a :class:`Correction`: another
format and/or another selection, given explicitly by the operator after review (the lesson's
rule: correct the input only by an explicit procedure, keep the operation's identity, one
effect). The replay is then a new submit of the corrected request — a **new snapshot** of the
tenant's notes as they are now (the original's snapshot stays with the original), the
corrected request's own ``request_hash``, the submit's validation, admission and
Idempotency-Key — and keeps ``replay_of``, the dead letter's ``replayed`` state and the
original's ``replayed`` event (which names what was corrected). The once-rule is the same:
asking again while that replay is queued or running, or after it succeeded, returns it when
the corrected request is the same, and is a conflict when it is another one.

A bulk replay of one reason (:func:`replay_dead_letters`, ``POST /v1/admin/replays``) is a
bulk action run in the request: running it twice, or twice at once, still makes one replay
per dead letter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg_pool import ConnectionPool

from exportcore import audit, telemetry
from exportcore.admission import admit
from exportcore.audit import SYSTEM, Actor, as_actor
from exportcore.db import Conn, Row, transaction
from exportcore.domain import (
    ExportError,
    ExportFormat,
    ExportRequest,
    JobNotFound,
    JobStateConflict,
    Labels,
    new_id,
    status_words,
)
from exportcore.settings import Settings
from exportcore.store import dead_letters as dl_store
from exportcore.store import jobs as job_store
from exportcore.submit import counted, earlier_job_for_key, submit_in_transaction

log = logging.getLogger(__name__)

MAX_CHAIN = 100
"""Longest replay chain followed (failed replay of a failed replay …); beyond it a replay is
refused as a conflict rather than walking on."""


class DeadLetterNotFound(ExportError):
    """No dead letter with this id."""

    code = "dead_letter_not_found"
    title = "Dead letter not found"
    kind = "not_found"


class DeadLetterResolved(ExportError):
    """The dead letter was already resolved (``extra``: who and when)."""

    code = "dead_letter_resolved"
    title = "Dead letter already resolved"
    kind = "conflict"


@dataclass(frozen=True)
class Correction:
    """A corrected input for a replay: another ``format``, and/or another selection —
    ``note_ids`` (the tenant's notes to export) or ``select_all`` (every note of the
    tenant). What is not given is kept from the job being replayed."""

    format: ExportFormat | None = None
    note_ids: tuple[int, ...] | None = None
    select_all: bool = False

    @property
    def fields(self) -> list[str]:
        """The corrected fields, as recorded in the history (``format``, ``selection``)."""
        out = ["format"] if self.format is not None else []
        return out + (["selection"] if self.note_ids is not None or self.select_all else [])

    def request(self, payload: dict[str, Any]) -> ExportRequest:
        """The corrected request: the job's canonical ``payload`` with these corrections
        (its metadata and tags and its age recipients kept: a replay is never less encrypted
        than the original). Raises ``InvalidSelection`` for a contradictory or empty
        selection."""
        fmt = self.format or ExportFormat(payload["format"])
        if self.note_ids is not None or self.select_all:
            return ExportRequest.build(
                fmt,
                list(self.note_ids) if self.note_ids is not None else None,
                self.select_all,
                labels=Labels.from_payload(payload),
                recipients=payload.get("recipients"),
            )
        return original_request(payload, fmt)


def original_request(payload: dict[str, Any], fmt: ExportFormat | None = None) -> ExportRequest:
    """The request a job's canonical ``payload`` describes (in ``fmt`` when given), its
    metadata and tags and age recipients included."""
    selection = payload["selection"]
    return ExportRequest.build(
        fmt or ExportFormat(payload["format"]),
        selection.get("note_ids"),
        bool(selection.get("all")),
        labels=Labels.from_payload(payload),
        recipients=payload.get("recipients"),
    )


@dataclass(frozen=True)
class Replayed:
    """The replay job, and whether this request wrote it (``created``) or found the
    existing one (active or succeeded)."""

    job: Row
    created: bool


def replay_export(
    pool: ConnectionPool[Conn],
    settings: Settings,
    *,
    original_id: UUID,
    actor: Actor | str = SYSTEM,
    trace_context: dict[str, str] | None = None,
    correction: Correction | None = None,
    idempotency_key: str | None = None,
) -> Replayed:
    """Replay the failed job ``original_id`` at most once (see the module docstring), with
    the original's snapshot, or with ``correction`` as a new submit of the corrected request
    (a new snapshot) that keeps ``replay_of``: the one entry point of a single replay,
    audited (``replay``, outcome ``done`` for a new replay, ``existing`` when one answered;
    the corrected fields in its detail) in the transaction that writes it.

    ``actor`` (an operator key: its prefix and label) is recorded on the dead letter as who
    asked and in the audit trail. ``idempotency_key`` is the job's tenant's Idempotency-Key,
    as for a submit (docs/architecture.md INV-11). Raises ``JobNotFound`` for an unknown id,
    ``JobStateConflict`` when the job did not fail (or the chain is longer than
    :data:`MAX_CHAIN`, or it already has a replay of another request),
    ``IdempotencyConflict``, ``InvalidSelection`` / ``UnknownNotes`` for a corrected
    selection the submit refuses, and ``CapacityExceeded`` / ``QuotaExceeded`` when
    admission refuses a new replay (nothing is written, the audit row included).
    """
    args = (pool, settings, original_id, as_actor(actor), trace_context, correction)
    try:
        return _replay(*args, idempotency_key)
    except psycopg.errors.UniqueViolation:
        # A replay written by a path that did not take the row lock won the unique index:
        # it is the active replay; read it in a new transaction.
        return _replay(*args, idempotency_key)


def _replay(
    pool: ConnectionPool[Conn],
    settings: Settings,
    original_id: UUID,
    actor: Actor,
    trace_context: dict[str, str] | None,
    correction: Correction | None,
    idempotency_key: str | None,
) -> Replayed:
    with (
        telemetry.span(
            "exports.submit", attributes={"source": "replay", "replay_of": original_id}
        ) as current,
        counted("replay") as count,
        transaction(pool) as conn,
    ):
        replayed = replay_in(
            conn,
            settings,
            original_id=original_id,
            actor=actor,
            trace_context=trace_context,
            correction=correction,
            idempotency_key=idempotency_key,
        )
        job = replayed.job
        detail: dict[str, object] = {"replay_id": str(job["id"])}
        if correction is not None:
            detail["corrected"] = correction.fields
        audit.record(
            conn,
            actor,
            "replay",
            target_kind="job",
            target_id=original_id,
            tenant_id=job["tenant_id"],
            job_id=original_id,
            outcome="done" if replayed.created else "existing",
            detail=detail,
        )
        telemetry.set_attributes(current, telemetry.job_attributes(job))
        count("accepted" if replayed.created else "idempotent_replay")
    if replayed.created:
        log.info(
            "replay accepted",
            extra={
                "job_id": str(job["id"]),
                "replay_of": str(job["replay_of"]),
                "corrected": correction.fields if correction else [],
            },
        )
    else:
        log.info(
            "replay exists", extra={"job_id": str(job["id"]), "replay_of": str(job["replay_of"])}
        )
    return replayed


def replay_in(
    conn: Conn,
    settings: Settings,
    *,
    original_id: UUID,
    actor: Actor,
    trace_context: dict[str, str] | None = None,
    bulk_id: int | None = None,
    admit_now: bool = True,
    correction: Correction | None = None,
    idempotency_key: str | None = None,
) -> Replayed:
    """Replay ``original_id`` on ``conn``, inside the caller's transaction (which the caller
    commits): lock it and follow its failed replays (:func:`_chain_tip`), write the replay
    (``job_replay``, or with ``correction`` a submit of the corrected request) and mark its
    dead letter replayed by ``actor``; or find the replay that already answers
    (``created=False``, nothing written; with ``idempotency_key``, also the job an earlier
    request with that key wrote). With ``admit_now`` the new job passes admission control
    here (the last statement before the caller's COMMIT); without, the caller admits it (a
    bulk batch admits all its new jobs together, last; a corrected replay is always
    admitted by its submit). Raises what :func:`replay_export` raises."""
    target = _chain_tip(conn, original_id)
    if isinstance(target, dict):  # an active or succeeded replay: the answer
        if correction is not None:
            _same_correction(conn, target, correction)
        return Replayed(target, created=False)
    failed = job_store.job_get(conn, job_id=target)
    assert failed is not None  # locked by _chain_tip
    job_id = new_id()
    if idempotency_key is not None:
        request = (correction.request if correction else original_request)(failed["payload"])
        earlier = earlier_job_for_key(
            conn, settings, failed["tenant_id"], request, idempotency_key, job_id
        )
        if earlier is not None:
            return Replayed(earlier, created=False)
    detail: dict[str, object] = {"requested_by": actor.requested_by}
    if bulk_id is not None:
        detail["bulk_id"] = bulk_id
    trace_context = trace_context or telemetry.current_context()
    if correction is None:
        job = job_store.job_replay(
            conn,
            original_id=target,
            job_id=job_id,
            message_id=new_id(),
            max_attempts=settings.max_attempts,
            deadline_seconds=settings.job_deadline_seconds,
            trace_context=trace_context,
            detail=detail,
        )
        assert job is not None  # the target is locked and failed
    else:
        # A new submit of the corrected request: a new snapshot of the notes as they are
        # now, validated and admitted like any submit (admission is its statement's last
        # step; the two marks below follow it before COMMIT: the dead letter references the
        # new job, which exists only from here on).
        job = submit_in_transaction(
            conn,
            settings,
            tenant_id=failed["tenant_id"],
            request=correction.request(failed["payload"]),
            source="replay",
            trace_context=trace_context,
            job_id=job_id,
            replay_of=target,
            event_detail={
                **detail,
                "replay_of": str(target),
                "corrected": correction.fields,
                "snapshot": "new",
                "original_request_hash": failed["request_hash"],
            },
        ).job
        job_store.job_mark_replayed(
            conn, job_id=target, replay_id=job["id"], corrected=correction.fields
        )
    dl_store.dead_letter_mark_replayed(
        conn, job_id=target, replay_job_id=job["id"], actor=actor.name
    )
    if admit_now and correction is None:
        admit(conn, tenant_id=job["tenant_id"], settings=settings)  # last, right before COMMIT
    return Replayed(job, created=True)


def _same_correction(conn: Conn, replay: Row, correction: Correction) -> None:
    """A replay exists (queued, running or succeeded): asking for a corrected one is
    answered with it only when it is the same corrected request; another one would be a
    second effect of the same failure. Raises ``JobStateConflict`` then."""
    replayed = job_store.job_get(conn, job_id=replay["replay_of"])
    wanted = correction.request(replayed["payload"] if replayed else replay["payload"])
    if wanted.request_hash() != replay["request_hash"]:
        raise JobStateConflict(
            f"export {replay['replay_of']} already has the replay {replay['id']} "
            f"({replay['status']}) of another request; a corrected replay is possible once "
            "that one failed or was cancelled",
            replay_id=str(replay["id"]),
        )


def _chain_tip(conn: Conn, original_id: UUID) -> UUID | Row:
    """Lock ``original_id`` and follow its failed replays: the id of the failed job to
    replay now, or the replay row that already answers (queued, running or succeeded)."""
    target = original_id
    for _ in range(MAX_CHAIN):
        locked = job_store.job_lock_for_replay(conn, job_id=target)
        if locked is None:
            raise JobNotFound(f"no export {original_id}")
        if locked["status"] != "failed":
            raise JobStateConflict(
                f"export {original_id} {status_words(locked['status'])}; only failed exports "
                "can be replayed"
            )
        latest = job_store.job_latest_replay(conn, job_id=target)
        if latest is None or latest["status"] == "cancelled":
            return target
        if latest["status"] != "failed":
            return latest
        target = latest["id"]
    raise JobStateConflict(
        f"export {original_id} has a chain of more than {MAX_CHAIN} failed replays; "
        "find out why before replaying it again"
    )


def resolve_dead_letter(
    pool: ConnectionPool[Conn],
    *,
    dead_letter_id: int,
    actor: Actor | str = SYSTEM,
    note: str | None = None,
) -> Row:
    """Mark a dead letter ``resolved`` by ``actor`` (with an optional note); returns it. The
    resolution is audited (``resolve``) in its transaction.

    Allowed from ``open`` and ``replayed``. Raises ``DeadLetterNotFound``, or
    ``DeadLetterResolved`` naming who resolved it and when.
    """
    actor = as_actor(actor)
    with transaction(pool) as conn:
        done = dl_store.dead_letter_resolve(
            conn, dead_letter_id=dead_letter_id, actor=actor.name, note=note
        )
        row = dl_store.dead_letter_get(conn, dead_letter_id=dead_letter_id)
        if done is not None and row is not None:
            audit.record(
                conn,
                actor,
                "resolve",
                target_kind="dead_letter",
                target_id=dead_letter_id,
                tenant_id=row["tenant_id"],
                job_id=row["job_id"],
                detail={"note": note} if note else {},
            )
    if row is None:
        raise DeadLetterNotFound(f"no dead letter {dead_letter_id}")
    if done is None:
        raise DeadLetterResolved(
            f"dead letter {dead_letter_id} was resolved by {row['resolved_by']} "
            f"at {row['resolved_at'].isoformat()}",
            resolved_by=row["resolved_by"],
            resolved_at=row["resolved_at"].isoformat(),
        )
    log.info(
        "dead letter resolved",
        extra={"dead_letter_id": dead_letter_id, "job_id": str(row["job_id"])},
    )
    return row
