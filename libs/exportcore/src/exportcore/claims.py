"""A worker's claim of one delivered message: where batches form.

The publisher sends small exports one job per message, and keeps at most
``PUBLISHER_MESSAGES_AHEAD`` of them on their way to the workers; while that many are sent
and not yet claimed, further small exports wait in the outbox. The claim of a message
takes them: in ONE transaction sent as one pipeline (one round trip, one commit), it

1. claims up to ``WORKER_CLAIM_JOBS`` - (the message's jobs) due events of its queue from
   the outbox, with the publishers' own fair claim (``outbox_mark_sent_and_claim_due`` after
   ``outbox_claim_lock``: per-tenant in-flight caps, round robin, oldest first;
   docs/architecture.md INV-16) for a token of its own;
2. claims the message's jobs and those jobs (``job_claim_many``: guarded per row, a fresh
   lease each, INV-3), stamping the dispatch of every event it delivers for the first time
   in the claim's own row version;
3. reads the first snapshot chunk of every job it claimed (``job_items_first_chunk_many``);
4. marks the delivered events sent and tells the publishers that the message arrived
   (``outbox_mark_delivered``: NOTIFY ``claimed:<task id>``).

It commits without waiting for its WAL flush (``CLAIMS_SYNCHRONOUS_COMMIT`` false, the
default): a claim a crash loses leaves the jobs queued as before it, the worker's lease
token exists nowhere, so its renewals and its finish are refused, and the jobs run again
(docs/architecture.md, "Commits a crash may lose").

So a batch is formed when a worker has a free slot and takes a message, from the backlog
that is really there at that moment: at low load the claim finds nothing more and runs one
job; a due export never waits while a worker is free, because a message is only held back
while ``PUBLISHER_MESSAGES_AHEAD`` others are already waiting for a worker, each of whose
claims takes the held ones. The message still carries job ids only (INV-2) and every job is
still claimed by the guarded statement (INV-3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID, uuid4

from psycopg.rows import class_row

from exportcore.db import Conn, Row
from exportcore.domain import BULK_QUEUE, FAST_QUEUE
from exportcore.settings import Settings
from exportcore.sql import q
from exportcore.store import jobs as job_store
from exportcore.store import outbox as outbox_store
from exportcore.store.jobs import JobRow

QUEUES = (FAST_QUEUE, BULK_QUEUE)


@dataclass(frozen=True)
class Claimed:
    """What one claim did: the jobs claimed (the message's and the taken ones, by id), the
    first snapshot chunk of each (by job id), and the jobs it took from the outbox beside the
    message (job id → that job's own outbox event: each taken job's dispatch)."""

    jobs: list[JobRow]
    chunks: dict[UUID, list[Row]]
    taken: dict[UUID, Row]


def take_limit(settings: Settings, queue: str | None, carried: int) -> int:
    """How many due events a claim of a message of ``queue`` carrying ``carried`` jobs may
    take from the outbox: ``WORKER_CLAIM_JOBS`` - ``carried`` on ``exports.fast``, none on
    another queue (bulk exports run one per message) or when the queue is unknown."""
    if queue != FAST_QUEUE:
        return 0
    return max(0, settings.worker_claim_jobs - carried)


def claim_delivery(
    conn: Conn,
    settings: Settings,
    *,
    job_ids: Sequence[UUID],
    message_ids: Sequence[UUID | None],
    queue: str | None = None,
    carrier: UUID | None = None,
) -> Claimed:
    """Claim the jobs of one delivered message (``job_ids`` with the outbox events
    ``message_ids`` that carried them; ``carrier``: the message's task id, None when not
    known) and, on ``exports.fast``, due jobs of the outbox beside them, in one transaction
    sent in one round trip (see the module). ``conn`` must be in autocommit mode with no
    transaction open. Raises ``psycopg.Error`` when the database fails (nothing is then
    claimed)."""
    take = take_limit(settings, queue, len(job_ids))
    token = uuid4() if take else None
    with conn.pipeline(), conn.transaction():
        if not settings.claims_synchronous_commit:  # a lost claim is only run again
            conn.execute(outbox_store.ASYNC_COMMIT)
        took = None
        if token is not None:
            outbox_store.outbox_claim_lock(conn)
            took = conn.execute(
                q("outbox", "outbox_mark_sent_and_claim_due"),
                outbox_store.claim_params(
                    claim_token=token,
                    limit=take,
                    fast_limit=take,
                    held_queues=[other for other in QUEUES if other != queue],
                    claim_seconds=settings.lease_seconds,
                    bulk_cap=settings.tenant_bulk_in_flight,
                    fast_cap=settings.tenant_fast_in_flight,
                ),
            )
        claim = conn.cursor(row_factory=class_row(JobRow))
        claim.execute(
            q("jobs", "job_claim_many"),
            job_store.claim_params(
                job_ids=job_ids,
                message_ids=message_ids,
                lease_seconds=settings.lease_seconds,
                take_token=token,
            ),
        )
        items = conn.execute(
            q("jobs", "job_items_first_chunk_many"),
            job_store.first_chunk_params(
                job_ids=job_ids,
                limit=settings.render_chunk_size,
                max_bytes=settings.render_chunk_bytes,
                take_token=token,
            ),
        )
        conn.execute(
            q("outbox", "outbox_mark_delivered"),
            outbox_store.mark_delivered_params(
                message_ids=message_ids, take_token=token, carrier=carrier
            ),
        )
        jobs = claim.fetchall()
        rows = items.fetchall()
        taken_rows = outbox_store.read_pass(took.fetchall()).events if took is not None else []
    claimed = {job.id for job in jobs}
    chunks = {k: v for k, v in job_store.group_chunks(rows).items() if k in claimed}
    taken = {r["job_id"]: r for r in taken_rows if r["job_id"] in claimed}
    return Claimed(jobs, chunks, taken)
