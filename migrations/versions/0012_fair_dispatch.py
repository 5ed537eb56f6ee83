"""Fair dispatch: per-tenant in-flight caps per queue, decided in the outbox claim.

- ``tenants.bulk_in_flight`` / ``fast_in_flight``: the tenant's own cap of jobs in flight on
  exports.bulk / exports.fast (NULL: the settings' ``TENANT_BULK_IN_FLIGHT`` /
  ``TENANT_FAST_IN_FLIGHT``), like ``max_active_jobs`` for the quota.
- ``export_outbox.tenant_id``: the job's tenant, copied when the event is written, so the
  claim can walk the pending events tenant by tenant (a skip scan over the tenants with
  pending events) without joining every pending event to its job.
- ``export_outbox_tenant_pending_idx``: pending events per (tenant, queue) in due order — the
  round robin takes each tenant's first events from it.
- ``export_outbox_claimed_idx``: the events a publisher holds (claimed, not yet marked sent
  or released); a handful at any time.
- ``export_jobs_in_flight_idx``: running jobs and queued jobs that were dispatched at least
  once, per (tenant, queue). A tenant's in-flight count walks only these (its cap plus its
  retrying jobs), never its undispatched backlog and never finished jobs.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE tenants
    ADD COLUMN bulk_in_flight integer CHECK (bulk_in_flight >= 1),
    ADD COLUMN fast_in_flight integer CHECK (fast_in_flight >= 1);
COMMENT ON COLUMN tenants.bulk_in_flight IS
    'jobs of the tenant in flight on exports.bulk at most; NULL = TENANT_BULK_IN_FLIGHT';
COMMENT ON COLUMN tenants.fast_in_flight IS
    'jobs of the tenant in flight on exports.fast at most; NULL = TENANT_FAST_IN_FLIGHT';

ALTER TABLE export_outbox ADD COLUMN tenant_id text;
UPDATE export_outbox o SET tenant_id = j.tenant_id FROM export_jobs j WHERE j.id = o.job_id;
ALTER TABLE export_outbox ALTER COLUMN tenant_id SET NOT NULL;
COMMENT ON COLUMN export_outbox.tenant_id IS
    'the job''s tenant (copied at insert): the claim''s round robin walks events per tenant';

CREATE INDEX export_outbox_tenant_pending_idx
    ON export_outbox (tenant_id, queue, available_at, id) WHERE sent_at IS NULL;
CREATE INDEX export_outbox_claimed_idx
    ON export_outbox (tenant_id, queue) WHERE sent_at IS NULL AND claim_token IS NOT NULL;
CREATE INDEX export_jobs_in_flight_idx
    ON export_jobs (tenant_id, queue)
    WHERE status = 'running' OR (status = 'queued' AND last_dispatched_at IS NOT NULL);
"""

DOWNGRADE = r"""
DROP INDEX IF EXISTS export_jobs_in_flight_idx;
DROP INDEX IF EXISTS export_outbox_claimed_idx;
DROP INDEX IF EXISTS export_outbox_tenant_pending_idx;
ALTER TABLE export_outbox DROP COLUMN tenant_id;
ALTER TABLE tenants DROP COLUMN fast_in_flight, DROP COLUMN bulk_in_flight;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
