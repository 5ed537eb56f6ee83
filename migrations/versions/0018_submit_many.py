"""Admission for several submits in one statement, each admitted or refused on its own.

- ``exports_admit_each(rows, tenants, capacity, default_quota)``: for each row in order,
  the capacity and quota check of ``exports_admit`` (docs/architecture.md INV-9
  admission-is-serialised: the global counter's row lock is taken first, then the
  tenant's, and held until COMMIT), but a refused row is returned with its SQLSTATE (XEX01
  over capacity, XEX02 over quota) and its message instead of raising, so the rows that fit
  are still admitted. The api's submit coalescer (``job_submit_many``) writes only the
  admitted rows. Rows admitted earlier in the same call count against the later ones.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE FUNCTION exports_admit_each(
    p_rows integer[], p_tenants text[], p_capacity integer, p_default_quota integer)
RETURNS TABLE (n integer, refusal text, detail text) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_active bigint;
    v_quota integer;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_rows, 1), 0) LOOP
        n := p_rows[i];
        refusal := NULL;
        detail := NULL;
        -- the global row first, as exports_admit: its lock serialises every admission
        INSERT INTO export_admission_counters (scope, admitted) VALUES ('*', 0)
        ON CONFLICT (scope) DO NOTHING;
        PERFORM 1 FROM export_admission_counters WHERE scope = '*' FOR UPDATE;
        v_active := exports_admission_active('*');
        IF v_active >= p_capacity THEN
            refusal := 'XEX01';
            detail := format('export capacity reached: %s active jobs, capacity %s',
                             v_active, p_capacity);
            RETURN NEXT;
            CONTINUE;
        END IF;
        INSERT INTO export_admission_counters (scope, admitted) VALUES (p_tenants[i], 0)
        ON CONFLICT (scope) DO NOTHING;
        PERFORM 1 FROM export_admission_counters WHERE scope = p_tenants[i] FOR UPDATE;
        v_active := exports_admission_active(p_tenants[i]);
        SELECT coalesce(max_active_jobs, p_default_quota) INTO v_quota
        FROM tenants WHERE id = p_tenants[i];
        IF v_active >= coalesce(v_quota, p_default_quota) THEN
            refusal := 'XEX02';
            detail := format('tenant quota reached: %s active jobs, quota %s',
                             v_active, coalesce(v_quota, p_default_quota));
            RETURN NEXT;
            CONTINUE;
        END IF;
        UPDATE export_admission_counters SET admitted = admitted + 1
        WHERE scope IN ('*', p_tenants[i]);
        RETURN NEXT;
    END LOOP;
END $$;
"""

DOWNGRADE = r"""
DROP FUNCTION IF EXISTS exports_admit_each(integer[], text[], integer, integer);
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
