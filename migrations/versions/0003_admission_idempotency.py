"""Admission control (serialised capacity and quota check) and idempotency keys.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

UPGRADE = r"""
-- Active jobs (queued + running) per tenant: what admission counts.
CREATE INDEX export_jobs_active_idx ON export_jobs (tenant_id)
    WHERE status IN ('queued', 'running');

-- exports_admit: the one admission rule of every entry point (API submit, replay, schedules).
-- Called as the LAST statement of the transaction that wrote the new job, right before
-- COMMIT: it takes a transaction-scoped advisory lock, so concurrent admissions are
-- serialised from the count to the commit and can never overshoot, and the section it
-- serialises is only this count plus the commit. The count includes the caller's own new
-- job (visible to its own transaction). Over the global capacity it raises SQLSTATE XEX01,
-- over the tenant's quota XEX02; the caller rolls back, so nothing is written.
CREATE FUNCTION exports_admit(p_tenant text, p_capacity integer, p_default_quota integer)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_active bigint;
    v_tenant_active bigint;
    v_quota integer;
BEGIN
    PERFORM pg_advisory_xact_lock(7310575183438734112);  -- 'exports:admission'
    SELECT count(*), count(*) FILTER (WHERE tenant_id = p_tenant)
      INTO v_active, v_tenant_active
      FROM export_jobs
     WHERE status IN ('queued', 'running');
    IF v_active > p_capacity THEN
        RAISE EXCEPTION 'export capacity reached: % active jobs, capacity %', v_active - 1, p_capacity
            USING ERRCODE = 'XEX01';
    END IF;
    SELECT coalesce(max_active_jobs, p_default_quota) INTO v_quota FROM tenants WHERE id = p_tenant;
    IF v_tenant_active > v_quota THEN
        RAISE EXCEPTION 'tenant quota reached: % active jobs, quota %', v_tenant_active - 1, v_quota
            USING ERRCODE = 'XEX02';
    END IF;
END $$;

-- Idempotency keys (IETF draft "The Idempotency-Key HTTP Header Field"), per tenant.
CREATE TABLE export_idempotency_keys (
    tenant_id     text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key           text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    request_hash  text NOT NULL,
    -- deferred: the key is reserved first in the submit transaction, the job written after
    job_id        uuid NOT NULL REFERENCES export_jobs (id) ON DELETE CASCADE
                  DEFERRABLE INITIALLY DEFERRED,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX export_idempotency_keys_expiry_idx ON export_idempotency_keys (expires_at);
"""

DOWNGRADE = r"""
DROP TABLE IF EXISTS export_idempotency_keys;
DROP FUNCTION IF EXISTS exports_admit(text, integer, integer);
DROP INDEX IF EXISTS export_jobs_active_idx;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
