"""Hot path: the child rows of a job without foreign-key checks; the admission read planned
once per connection.

- ``export_job_items``, ``export_outbox``, ``export_job_events`` lose their foreign key to
  ``export_jobs``. Each of them is written only by the one statement that inserts, updates
  or locks its job in the same statement (docs/architecture.md INV-17
  children-with-their-job), so the key's check — an index probe and a KEY SHARE lock on
  the job row, 11 times per small export — only cost CPU and WAL. Their ``ON DELETE
  CASCADE`` is kept by ``export_jobs_delete_children``: one statement-level trigger deletes
  the children of every deleted job (retention, an operator's manual delete), so a job never
  leaves them behind. The dead letters, idempotency keys and schedule slots keep their keys
  (they are not written per small export).
- ``exports_admission_active`` becomes PL/pgSQL: as a LANGUAGE sql function called from
  ``exports_admission_open`` it was planned again on every call (twice per submit); the
  queries of a PL/pgSQL function are planned once per connection.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE export_job_items DROP CONSTRAINT export_job_items_job_id_fkey;
ALTER TABLE export_outbox DROP CONSTRAINT export_outbox_job_id_fkey;
ALTER TABLE export_job_events DROP CONSTRAINT export_job_events_job_id_fkey;

-- What ON DELETE CASCADE did for the three tables, once per statement (not per row).
CREATE FUNCTION exports_delete_job_children() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM export_job_items WHERE job_id IN (SELECT id FROM gone);
    DELETE FROM export_outbox WHERE job_id IN (SELECT id FROM gone);
    DELETE FROM export_job_events WHERE job_id IN (SELECT id FROM gone);
    RETURN NULL;
END $$;

CREATE TRIGGER export_jobs_delete_children
    AFTER DELETE ON export_jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION exports_delete_job_children();

-- Active jobs of a scope as the counters say (read only, no lock); planned once per
-- connection.
CREATE OR REPLACE FUNCTION exports_admission_active(p_scope text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((SELECT admitted FROM export_admission_counters WHERE scope = p_scope), 0)
         - coalesce((SELECT sum(released) FROM export_admission_releases WHERE scope = p_scope), 0);
END $$;
"""

DOWNGRADE = r"""
CREATE OR REPLACE FUNCTION exports_admission_active(p_scope text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT admitted FROM export_admission_counters WHERE scope = p_scope), 0)
         - coalesce((SELECT sum(released) FROM export_admission_releases WHERE scope = p_scope), 0)
$$;
DROP TRIGGER IF EXISTS export_jobs_delete_children ON export_jobs;
DROP FUNCTION IF EXISTS exports_delete_job_children();
DELETE FROM export_job_items i WHERE NOT EXISTS (SELECT 1 FROM export_jobs j WHERE j.id = i.job_id);
DELETE FROM export_outbox o WHERE NOT EXISTS (SELECT 1 FROM export_jobs j WHERE j.id = o.job_id);
DELETE FROM export_job_events e WHERE NOT EXISTS (SELECT 1 FROM export_jobs j WHERE j.id = e.job_id);
ALTER TABLE export_job_items ADD CONSTRAINT export_job_items_job_id_fkey
    FOREIGN KEY (job_id) REFERENCES export_jobs (id) ON DELETE CASCADE;
ALTER TABLE export_outbox ADD CONSTRAINT export_outbox_job_id_fkey
    FOREIGN KEY (job_id) REFERENCES export_jobs (id) ON DELETE CASCADE;
ALTER TABLE export_job_events ADD CONSTRAINT export_job_events_job_id_fkey
    FOREIGN KEY (job_id) REFERENCES export_jobs (id) ON DELETE CASCADE;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
