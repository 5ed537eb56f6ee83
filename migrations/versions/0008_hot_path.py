"""Hot path: admission in O(1) (counters kept with the transitions), HOT-friendly fill factors.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

Admission used to count every active job under a global advisory lock at every submit, so
its cost grew with the backlog. Now:

- ``export_admission_counters`` holds, per scope (``'*'`` = global, else a tenant id), how
  many jobs were ever ADMITTED. ``exports_admit`` increments the global row and then the
  tenant row (always in that order, so two transactions never wait on each other in a
  cycle); the row locks serialise admissions exactly as the advisory lock did, from the
  check to the COMMIT, so the count never overshoots (docs/architecture.md
  INV-9 admission-is-serialised).
- ``export_admission_releases`` holds, per scope and per shard, how many active jobs were
  RELEASED (reached a terminal state or were deleted). A trigger increments them in the same
  transaction as the transition, in a shard chosen by the backend (``pg_backend_pid() % 16``),
  so finishing workers neither wait for submits nor for each other.
- active(scope) = admitted(scope) - sum(released(scope, *)). A submit reads the releases
  after taking its lock; a release committed a moment later is simply not seen yet, which
  over-estimates the active count (refuses early), never under-estimates it.
- The recovery-scanner reconciles: one statement computes, from one snapshot, the drift
  between the counters and the rows and subtracts it (a delta, so changes committed
  concurrently are kept). Drift appears only when jobs are written outside the admission
  path (manual SQL); the transitions themselves keep the counters exact.

Fill factors leave room on each page so that updates which change no indexed column (the
dispatch stamp, a lease renewal, an outbox mark) stay heap-only tuples (HOT): no new index
entries. The two counter tables get fill factor 10: every admission and release updates a
few hot rows, and a page is pruned of their dead versions once its free space falls under
its fill-factor reserve, so a low fill factor keeps the chain of versions that each lookup
follows short (measured: with 50, submit CPU grew with the number of admissions since the
last prune).
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE export_jobs SET (fillfactor = 70);
ALTER TABLE export_outbox SET (fillfactor = 80);

CREATE TABLE export_admission_counters (
    scope     text PRIMARY KEY,          -- '*' = global capacity, else a tenant id
    admitted  bigint NOT NULL DEFAULT 0
) WITH (fillfactor = 10);

CREATE TABLE export_admission_releases (
    scope     text NOT NULL,             -- as above
    shard     smallint NOT NULL CHECK (shard BETWEEN 0 AND 15),
    released  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, shard)
) WITH (fillfactor = 10);

INSERT INTO export_admission_counters (scope, admitted)
SELECT '*', count(*) FROM export_jobs WHERE status IN ('queued', 'running');
INSERT INTO export_admission_counters (scope, admitted)
SELECT tenant_id, count(*) FROM export_jobs WHERE status IN ('queued', 'running')
GROUP BY tenant_id;

-- A job leaves the active set (queued/running -> terminal, or deleted while active): count
-- one release for the global scope and one for its tenant, in the backend's shard, in the
-- same transaction as the transition. The global row is taken first, like exports_admit.
CREATE FUNCTION exports_admission_release() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_shard smallint := pg_backend_pid() % 16;
BEGIN
    INSERT INTO export_admission_releases AS r (scope, shard, released)
    VALUES ('*', v_shard, 1), (OLD.tenant_id, v_shard, 1)
    ON CONFLICT (scope, shard) DO UPDATE SET released = r.released + 1;
    RETURN NULL;
END $$;

CREATE TRIGGER export_jobs_admission_release
    AFTER UPDATE OF status ON export_jobs
    FOR EACH ROW
    WHEN (OLD.status IN ('queued', 'running') AND NEW.status NOT IN ('queued', 'running'))
    EXECUTE FUNCTION exports_admission_release();

CREATE TRIGGER export_jobs_admission_release_on_delete
    AFTER DELETE ON export_jobs
    FOR EACH ROW
    WHEN (OLD.status IN ('queued', 'running'))
    EXECUTE FUNCTION exports_admission_release();

-- Active jobs of a scope as the counters say (read only, no lock).
CREATE FUNCTION exports_admission_active(p_scope text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT admitted FROM export_admission_counters WHERE scope = p_scope), 0)
         - coalesce((SELECT sum(released) FROM export_admission_releases WHERE scope = p_scope), 0)
$$;

-- The cheap refusal a submit makes BEFORE it copies the snapshot: no lock, just the
-- counters. Raises the same errors as exports_admit when the scope is already full; a
-- pass here is only a hint, exports_admit decides.
CREATE FUNCTION exports_admission_open(p_tenant text, p_capacity integer, p_default_quota integer)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_active bigint := exports_admission_active('*');
    v_tenant bigint;
    v_quota integer;
BEGIN
    IF v_active >= p_capacity THEN
        RAISE EXCEPTION 'export capacity reached: % active jobs, capacity %', v_active, p_capacity
            USING ERRCODE = 'XEX01';
    END IF;
    v_tenant := exports_admission_active(p_tenant);
    SELECT coalesce(max_active_jobs, p_default_quota) INTO v_quota FROM tenants WHERE id = p_tenant;
    IF v_tenant >= v_quota THEN
        RAISE EXCEPTION 'tenant quota reached: % active jobs, quota %', v_tenant, v_quota
            USING ERRCODE = 'XEX02';
    END IF;
    RETURN true;
END $$;

-- exports_admit, same contract as in 0003 (the LAST statement of the transaction that
-- wrote one new active job, right before COMMIT; XEX01 over capacity, XEX02 over quota),
-- now O(1): it counts the new job into the global and the tenant counters, whose row
-- locks serialise admissions until COMMIT, and compares against the releases.
CREATE OR REPLACE FUNCTION exports_admit(p_tenant text, p_capacity integer, p_default_quota integer)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_admitted bigint;
    v_active bigint;
    v_quota integer;
BEGIN
    UPDATE export_admission_counters SET admitted = admitted + 1 WHERE scope = '*'
    RETURNING admitted INTO v_admitted;
    IF NOT FOUND THEN
        INSERT INTO export_admission_counters AS c (scope, admitted) VALUES ('*', 1)
        ON CONFLICT (scope) DO UPDATE SET admitted = c.admitted + 1
        RETURNING admitted INTO v_admitted;
    END IF;
    v_active := v_admitted - coalesce(
        (SELECT sum(released) FROM export_admission_releases WHERE scope = '*'), 0);
    IF v_active > p_capacity THEN
        RAISE EXCEPTION 'export capacity reached: % active jobs, capacity %', v_active - 1, p_capacity
            USING ERRCODE = 'XEX01';
    END IF;
    INSERT INTO export_admission_counters AS c (scope, admitted) VALUES (p_tenant, 1)
    ON CONFLICT (scope) DO UPDATE SET admitted = c.admitted + 1
    RETURNING admitted INTO v_admitted;
    v_active := v_admitted - coalesce(
        (SELECT sum(released) FROM export_admission_releases WHERE scope = p_tenant), 0);
    SELECT coalesce(max_active_jobs, p_default_quota) INTO v_quota FROM tenants WHERE id = p_tenant;
    IF v_active > v_quota THEN
        RAISE EXCEPTION 'tenant quota reached: % active jobs, quota %', v_active - 1, v_quota
            USING ERRCODE = 'XEX02';
    END IF;
END $$;

"""

DOWNGRADE = r"""
DROP TRIGGER IF EXISTS export_jobs_admission_release ON export_jobs;
DROP TRIGGER IF EXISTS export_jobs_admission_release_on_delete ON export_jobs;
DROP FUNCTION IF EXISTS exports_admission_release();
DROP FUNCTION IF EXISTS exports_admission_open(text, integer, integer);
DROP FUNCTION IF EXISTS exports_admission_active(text);
DROP TABLE IF EXISTS export_admission_releases;
DROP TABLE IF EXISTS export_admission_counters;
CREATE OR REPLACE FUNCTION exports_admit(p_tenant text, p_capacity integer, p_default_quota integer)
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
ALTER TABLE export_outbox RESET (fillfactor);
ALTER TABLE export_jobs RESET (fillfactor);
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
