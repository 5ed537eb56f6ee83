"""Operations: operator keys of their own kind, dead-letter states, one active replay per job.

- ``operator_keys``: keys that act across tenants (``/v1/admin``), tied to no tenant and
  created only with ``exportctl operator-key create`` (database access). Tenant keys lose
  the ``admin`` scope: it is stripped from every tenant key (a key that held nothing else is
  revoked, since it could no longer do anything), and a CHECK keeps it out for good.
- ``export_dead_letters`` gains a state: ``open`` → ``replayed`` (by whom, when, which job)
  or ``resolved`` (by whom, when, an optional note). Dead letters whose job was already
  replayed before this revision start as ``replayed``.
- ``export_jobs_one_active_replay``: at most one queued or running replay per job (the
  durable guard behind idempotent replay). Duplicate active replays that the old code may
  have created are repaired first: queued duplicates are cancelled (they never ran), running
  duplicates are detached (``replay_of`` cleared) and left to finish; both get a history event.

Downgrade drops the new table, columns and index; scopes stripped from tenant keys are not
restored (the holder of such a key should get an operator key instead).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE operator_keys (
    id          uuid PRIMARY KEY,
    key_hash    bytea NOT NULL UNIQUE,
    prefix      text NOT NULL,
    label       text NOT NULL CHECK (length(label) BETWEEN 1 AND 100),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
COMMENT ON TABLE operator_keys IS
    'API keys of operators: cross-tenant /v1/admin access, no tenant; only a SHA-256 is stored';

-- A tenant key never holds a cross-tenant scope.
UPDATE api_keys SET revoked_at = now()
WHERE revoked_at IS NULL AND 'admin' = ANY (scopes) AND scopes <@ ARRAY['admin']::text[];
UPDATE api_keys SET scopes = array_remove(scopes, 'admin') WHERE 'admin' = ANY (scopes);
ALTER TABLE api_keys ADD CONSTRAINT api_keys_no_cross_tenant_scope
    CHECK (NOT ('admin' = ANY (scopes)));

ALTER TABLE export_dead_letters
    ADD COLUMN state text NOT NULL DEFAULT 'open'
        CHECK (state IN ('open', 'replayed', 'resolved')),
    ADD COLUMN replay_job_id uuid REFERENCES export_jobs (id) ON DELETE SET NULL,
    ADD COLUMN replayed_at timestamptz,
    ADD COLUMN replayed_by text,
    ADD COLUMN resolved_at timestamptz,
    ADD COLUMN resolved_by text,
    ADD COLUMN resolution_note text,
    ADD CONSTRAINT export_dead_letters_replayed_when
        CHECK (state <> 'replayed' OR replayed_at IS NOT NULL),
    ADD CONSTRAINT export_dead_letters_resolved_who
        CHECK (state <> 'resolved' OR (resolved_at IS NOT NULL AND resolved_by IS NOT NULL));
-- the operators' work list: open dead letters by reason, newest first
CREATE INDEX export_dead_letters_state_idx ON export_dead_letters (state, reason, id DESC);

-- Repair duplicate active replays (created before replay was idempotent): keep the oldest.
CREATE TEMPORARY TABLE replay_duplicates ON COMMIT DROP AS
SELECT id, status, replay_of FROM (
    SELECT id, status, replay_of,
           row_number() OVER (PARTITION BY replay_of ORDER BY created_at, id) AS n
    FROM export_jobs
    WHERE replay_of IS NOT NULL AND status IN ('queued', 'running')
) ranked WHERE n > 1;
INSERT INTO export_job_events (job_id, kind, from_status, to_status, detail)
SELECT id, CASE status WHEN 'queued' THEN 'cancelled' ELSE 'replay_detached' END,
       status, CASE status WHEN 'queued' THEN 'cancelled' ELSE status END,
       jsonb_build_object('reason', 'duplicate active replay (revision 0007)',
                          'replay_of', replay_of)
FROM replay_duplicates;
UPDATE export_jobs j
SET status = 'cancelled', cancel_requested = true, finished_at = now(), updated_at = now()
FROM replay_duplicates d WHERE j.id = d.id AND d.status = 'queued';
UPDATE export_jobs j SET replay_of = NULL, updated_at = now()
FROM replay_duplicates d WHERE j.id = d.id AND d.status = 'running';

-- Dead letters whose job was replayed already: replayed, by its active (else newest) replay.
UPDATE export_dead_letters d
SET state = 'replayed', replay_job_id = r.id, replayed_at = r.created_at,
    replayed_by = 'before revision 0007'
FROM (
    SELECT DISTINCT ON (replay_of) replay_of, id, created_at
    FROM export_jobs WHERE replay_of IS NOT NULL
    ORDER BY replay_of, status IN ('queued', 'running') DESC, created_at DESC, id DESC
) r
WHERE r.replay_of = d.job_id;

CREATE UNIQUE INDEX export_jobs_one_active_replay ON export_jobs (replay_of)
    WHERE replay_of IS NOT NULL AND status IN ('queued', 'running');
"""

DOWNGRADE = r"""
DROP INDEX IF EXISTS export_jobs_one_active_replay;
DROP INDEX IF EXISTS export_dead_letters_state_idx;
ALTER TABLE export_dead_letters
    DROP CONSTRAINT IF EXISTS export_dead_letters_resolved_who,
    DROP CONSTRAINT IF EXISTS export_dead_letters_replayed_when,
    DROP COLUMN IF EXISTS resolution_note,
    DROP COLUMN IF EXISTS resolved_by,
    DROP COLUMN IF EXISTS resolved_at,
    DROP COLUMN IF EXISTS replayed_by,
    DROP COLUMN IF EXISTS replayed_at,
    DROP COLUMN IF EXISTS replay_job_id,
    DROP COLUMN IF EXISTS state;
ALTER TABLE api_keys DROP CONSTRAINT IF EXISTS api_keys_no_cross_tenant_scope;
DROP TABLE IF EXISTS operator_keys;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
