"""Reads that several statements share, each defined once in the database.

- ``export_dead_letter_rows``: a dead letter as the API and the console show it (the
  dead letter's columns, ``replay_job_id`` as ``replayed_by`` and ``replayed_by`` as
  ``replay_requested_by``, the status of the replay recorded on it as ``replay_status``,
  its job's queue). ``dead_letters.sql`` reads it for a page and for one dead letter. A
  plain view: PostgreSQL plans the statement as if its joins were written in it.
- ``exports_pair_load(tenant, queue, fast, bulk, fast_default, bulk_default, sent_ids)``:
  the load of a (tenant, queue) pair (docs/architecture.md INV-16 fair-dispatch): ``cap``,
  the tenant's own cap on the queue (``fast`` / ``bulk``: its ``tenants.fast_in_flight`` /
  ``bulk_in_flight``, NULL for none) else the default, and ``in_flight``, the pair's jobs
  IN FLIGHT counted from the rows: running, or queued and dispatched (an event sent or
  held by a publisher) with no claimable event of its own; a job waiting for a retry's
  backoff or a redispatch is not in flight. The events of ``sent_ids`` (being marked sent
  by the calling statement) count as sent. Counted up to the cap only: past it the pair
  takes nothing anyway. Read by the fair claim (``outbox_mark_sent_and_claim_due``) and by
  the held-back gauge (``metrics_tenant_backlog``), so both count with one text; the count
  walks ``export_jobs_in_flight_idx``.
- ``exports_lease_holder(job_id, lease_token)``: the job, if it is running under
  ``lease_token`` with an unexpired lease: the guard of a checkpoint's writes
  (``checkpoints.sql``: save, take over, discard).
- ``exports_bulk_cancel_match(as_of, status, queue, tenant, created_from, created_to)``:
  the jobs a bulk cancel may act on: active, no cancel requested yet, created by ``as_of``,
  matching the filter (each part optional: NULL matches all). Read by the run's
  confirmation count and by its batches (``bulk_actions.sql``), so a run acts on exactly
  what it counted.
- ``exports_bulk_replay_match(as_of, reason, tenant, queue, created_from, created_to)``:
  the dead letters a bulk replay may act on: open, dead-lettered by ``as_of``, matching
  the filter (``reason`` is the job's error code), likewise for the count and the batches.

Each function is LANGUAGE sql, STABLE, not STRICT and returns a set: the planner inlines
it into the calling statement (a subquery in its place, then pulled up into it), so the
statements keep the plans they had with the text written in them.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE VIEW export_dead_letter_rows AS
SELECT d.id, d.job_id, d.tenant_id, d.reason, d.detail, d.attempts, d.created_at,
       d.state, d.replay_job_id AS replayed_by, d.replayed_at, d.replayed_by AS replay_requested_by,
       d.resolved_at, d.resolved_by, d.resolution_note, r.status AS replay_status, j.queue
FROM export_dead_letters d
JOIN export_jobs j ON j.id = d.job_id
LEFT JOIN export_jobs r ON r.id = d.replay_job_id;
COMMENT ON VIEW export_dead_letter_rows IS
    'a dead letter as the API and the console show it: its job''s queue and the status of '
    'the replay recorded on it';

CREATE FUNCTION exports_pair_load(
    p_tenant text, p_queue text, p_fast integer, p_bulk integer,
    p_fast_default bigint, p_bulk_default bigint, p_sent_ids uuid[])
RETURNS TABLE (cap bigint, in_flight integer) LANGUAGE sql STABLE AS $$
    SELECT c.cap, f.in_flight
    FROM (SELECT CASE WHEN p_queue = 'exports.fast' THEN coalesce(p_fast, p_fast_default)
                      ELSE coalesce(p_bulk, p_bulk_default) END AS cap) c
    CROSS JOIN LATERAL (
        SELECT count(*)::int AS in_flight FROM (
            SELECT j.id FROM export_jobs j
            WHERE j.tenant_id = p_tenant AND j.queue = p_queue
              AND (j.status = 'running'
                   OR (j.status = 'queued' AND j.last_dispatched_at IS NOT NULL))
              AND (j.status = 'running' OR NOT EXISTS (
                  SELECT 1 FROM export_outbox p
                  WHERE p.job_id = j.id AND p.sent_at IS NULL
                    AND (p.claimed_until IS NULL OR p.claimed_until < now())
                    AND p.id <> ALL(p_sent_ids)))
            UNION
            SELECT o.job_id FROM export_outbox o
            JOIN export_jobs j ON j.id = o.job_id
            WHERE o.tenant_id = p_tenant AND o.queue = p_queue
              AND o.sent_at IS NULL AND o.claim_token IS NOT NULL
              AND (o.claimed_until >= now() OR o.id = ANY(p_sent_ids))
              AND j.status IN ('queued', 'running')
            LIMIT c.cap
        ) busy
    ) f
$$;
COMMENT ON FUNCTION exports_pair_load(text, text, integer, integer, bigint, bigint, uuid[]) IS
    'the cap of a (tenant, queue) pair and its jobs in flight up to the cap; the events of '
    'sent_ids count as sent (docs/architecture.md INV-16)';

CREATE FUNCTION exports_lease_holder(p_job_id uuid, p_lease_token uuid)
RETURNS TABLE (id uuid) LANGUAGE sql STABLE AS $$
    SELECT j.id FROM export_jobs j
    WHERE j.id = p_job_id
      AND j.status = 'running'
      AND j.lease_token = p_lease_token
      AND j.lease_expires_at > now()
$$;
COMMENT ON FUNCTION exports_lease_holder(uuid, uuid) IS
    'the job, if it is running under the lease token with an unexpired lease';

CREATE FUNCTION exports_bulk_cancel_match(
    p_as_of timestamptz, p_status text, p_queue text, p_tenant text,
    p_created_from timestamptz, p_created_to timestamptz)
RETURNS SETOF export_jobs LANGUAGE sql STABLE AS $$
    SELECT j.* FROM export_jobs j
    WHERE j.status IN ('queued', 'running') AND NOT j.cancel_requested
      AND j.created_at <= p_as_of
      AND (p_status IS NULL OR j.status = p_status)
      AND (p_queue IS NULL OR j.queue = p_queue)
      AND (p_tenant IS NULL OR j.tenant_id = p_tenant)
      AND (p_created_from IS NULL OR j.created_at >= p_created_from)
      AND (p_created_to IS NULL OR j.created_at < p_created_to)
$$;
COMMENT ON FUNCTION exports_bulk_cancel_match(
    timestamptz, text, text, text, timestamptz, timestamptz) IS
    'the jobs a bulk cancel of this filter may act on (active, no cancel requested, created '
    'by as_of)';

CREATE FUNCTION exports_bulk_replay_match(
    p_as_of timestamptz, p_reason text, p_tenant text, p_queue text,
    p_created_from timestamptz, p_created_to timestamptz)
RETURNS SETOF export_dead_letters LANGUAGE sql STABLE AS $$
    SELECT d.* FROM export_dead_letters d JOIN export_jobs j ON j.id = d.job_id
    WHERE d.state = 'open'
      AND d.created_at <= p_as_of
      AND (p_reason IS NULL OR d.reason = p_reason)
      AND (p_tenant IS NULL OR d.tenant_id = p_tenant)
      AND (p_queue IS NULL OR j.queue = p_queue)
      AND (p_created_from IS NULL OR j.created_at >= p_created_from)
      AND (p_created_to IS NULL OR j.created_at < p_created_to)
$$;
COMMENT ON FUNCTION exports_bulk_replay_match(
    timestamptz, text, text, text, timestamptz, timestamptz) IS
    'the dead letters a bulk replay of this filter may act on (open, dead-lettered by as_of)';
"""

DOWNGRADE = r"""
DROP FUNCTION IF EXISTS exports_pair_load(text, text, integer, integer, bigint, bigint, uuid[]);
DROP FUNCTION IF EXISTS exports_bulk_replay_match(
    timestamptz, text, text, text, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS exports_bulk_cancel_match(
    timestamptz, text, text, text, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS exports_lease_holder(uuid, uuid);
DROP VIEW IF EXISTS export_dead_letter_rows;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
