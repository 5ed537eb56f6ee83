"""Operator console: server-side sessions of operator keys, admission refusals per tenant, and
the indexes its pages read through (no page scans export_jobs).

Dead-letter states (open / replayed / resolved, who and when) are the columns of revision
0007 on export_dead_letters: the console keeps no table of its own for them.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

UPGRADE = r"""
-- A signed-in operator: the cookie carries a random token, the table only its SHA-256 (like
-- the keys), so a copy of the table signs nobody in. A session belongs to an operator key
-- (operator_keys, revision 0007; tenant keys never sign in). It ends at expires_at, after
-- CONSOLE_IDLE_MINUTES without a request, at logout (row deleted), or when its key is
-- revoked or deleted (checked on every request; the row goes with the key).
CREATE TABLE console_sessions (
    token_hash    bytea PRIMARY KEY,
    key_id        uuid NOT NULL REFERENCES operator_keys (id) ON DELETE CASCADE,
    -- the synchronizer token every state-changing request must echo (OWASP CSRF cheat sheet)
    csrf_token    text NOT NULL CHECK (length(csrf_token) >= 32),
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
CREATE INDEX console_sessions_expiry_idx ON console_sessions (expires_at);
CREATE INDEX console_sessions_key_idx ON console_sessions (key_id);

-- Admission refusals per tenant and minute, in a ring of 60 slots per (tenant, code): the
-- slot of a minute is overwritten when that minute comes round again, so the table never
-- grows past 60 rows per tenant and code and needs no pruning. "Refused in the last hour"
-- sums the slots whose minute is less than an hour old. Rate-limited submits are refused
-- before any database work (in Redis), so they are not counted here.
CREATE TABLE tenant_admission_refusals (
    tenant_id  text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    code       text NOT NULL CHECK (code IN ('quota_exceeded', 'capacity_exceeded')),
    slot       smallint NOT NULL CHECK (slot BETWEEN 0 AND 59),
    minute     timestamptz NOT NULL,
    refused    integer NOT NULL CHECK (refused >= 0),
    PRIMARY KEY (tenant_id, code, slot)
);

-- The console's jobs page: newest first (keyset on created_at, id) overall, by state, by
-- queue and by error code; by tenant it reads export_jobs_tenant_created_idx (0001).
CREATE INDEX export_jobs_created_idx ON export_jobs (created_at DESC, id DESC);
CREATE INDEX export_jobs_status_created_idx ON export_jobs (status, created_at DESC, id DESC);
CREATE INDEX export_jobs_queue_created_idx ON export_jobs (queue, created_at DESC, id DESC);
CREATE INDEX export_jobs_error_created_idx ON export_jobs (error_code, created_at DESC, id DESC)
    WHERE error_code IS NOT NULL;

-- The dead-letter groups (counts per reason and state, tenants involved, newest): one
-- index-only scan of this covering index instead of reading the table.
CREATE INDEX export_dead_letters_groups_idx ON export_dead_letters (reason, state)
    INCLUDE (tenant_id, created_at);
"""

DOWNGRADE = r"""
DROP INDEX IF EXISTS export_dead_letters_groups_idx;
DROP INDEX IF EXISTS export_jobs_error_created_idx;
DROP INDEX IF EXISTS export_jobs_queue_created_idx;
DROP INDEX IF EXISTS export_jobs_status_created_idx;
DROP INDEX IF EXISTS export_jobs_created_idx;
DROP TABLE IF EXISTS tenant_admission_refusals;
DROP TABLE IF EXISTS console_sessions;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
