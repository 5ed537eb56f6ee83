"""Admission of a batch: ``exports_admit_many`` counts n new jobs of one tenant at once.

A bulk replay writes its new jobs set-based, a batch per statement (``job_replay_many``),
and then passes admission control for the whole batch, per tenant, as the last statements
before COMMIT. ``exports_admit_many(tenant, n, capacity, default_quota)`` is
``exports_admit`` (migration 0008) with ``n`` in place of 1: the global counter row first,
then the tenant's (the same order, so it never waits on a submit in a cycle), their row
locks serialising it with every other admission until COMMIT (docs/architecture.md INV-9
admission-is-serialised); XEX01 when the n jobs would overshoot capacity, XEX02 the tenant's
quota, and the caller rolls the batch back. One update of each counter row per tenant and
batch, instead of one per job (n updates of one row in one transaction leave n versions of
it for every later lookup to walk).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE FUNCTION exports_admit_many(
    p_tenant text, p_count integer, p_capacity integer, p_default_quota integer)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_admitted bigint;
    v_active bigint;
    v_quota integer;
BEGIN
    IF p_count < 1 THEN
        RETURN;
    END IF;
    INSERT INTO export_admission_counters AS c (scope, admitted) VALUES ('*', p_count)
    ON CONFLICT (scope) DO UPDATE SET admitted = c.admitted + p_count
    RETURNING admitted INTO v_admitted;
    v_active := v_admitted - coalesce(
        (SELECT sum(released) FROM export_admission_releases WHERE scope = '*'), 0);
    IF v_active > p_capacity THEN
        RAISE EXCEPTION 'export capacity reached: % active jobs, % more asked, capacity %',
            v_active - p_count, p_count, p_capacity
            USING ERRCODE = 'XEX01';
    END IF;
    INSERT INTO export_admission_counters AS c (scope, admitted) VALUES (p_tenant, p_count)
    ON CONFLICT (scope) DO UPDATE SET admitted = c.admitted + p_count
    RETURNING admitted INTO v_admitted;
    v_active := v_admitted - coalesce(
        (SELECT sum(released) FROM export_admission_releases WHERE scope = p_tenant), 0);
    SELECT coalesce(max_active_jobs, p_default_quota) INTO v_quota FROM tenants WHERE id = p_tenant;
    IF v_active > v_quota THEN
        RAISE EXCEPTION 'tenant quota reached: % active jobs, % more asked, quota %',
            v_active - p_count, p_count, v_quota
            USING ERRCODE = 'XEX02';
    END IF;
END $$;
"""

DOWNGRADE = r"""
DROP FUNCTION IF EXISTS exports_admit_many(text, integer, integer, integer);
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
