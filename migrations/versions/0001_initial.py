"""Initial schema: tenants, api keys, notes, export jobs, snapshot items, outbox, history.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE tenants (
    id               text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    name             text NOT NULL,
    max_active_jobs  integer CHECK (max_active_jobs >= 0),
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id          uuid PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key_hash    bytea NOT NULL UNIQUE,
    prefix      text NOT NULL,
    scopes      text[] NOT NULL,
    label       text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_tenant_idx ON api_keys (tenant_id);

CREATE TABLE notes (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    source_path  text,
    title        text NOT NULL,
    content      text NOT NULL,
    pinned       boolean NOT NULL DEFAULT false,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT notes_tenant_source_path_key UNIQUE (tenant_id, source_path)
);
CREATE INDEX notes_tenant_id_idx ON notes (tenant_id, id);

CREATE TABLE export_jobs (
    id                  uuid PRIMARY KEY,
    tenant_id           text NOT NULL REFERENCES tenants (id),
    status              text NOT NULL DEFAULT 'queued'
                        CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    queue               text NOT NULL CHECK (queue IN ('exports.fast', 'exports.bulk')),
    format              text NOT NULL CHECK (format IN ('json', 'ndjson', 'markdown_zip')),
    payload             jsonb NOT NULL,
    note_count          integer NOT NULL CHECK (note_count >= 0),
    request_hash        text NOT NULL,
    idempotency_key     text,
    attempts            integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts        integer NOT NULL CHECK (max_attempts >= 1),
    dispatch_count      integer NOT NULL DEFAULT 0,
    lease_token         uuid,
    lease_expires_at    timestamptz,
    next_attempt_at     timestamptz NOT NULL DEFAULT now(),
    last_dispatched_at  timestamptz,
    cancel_requested    boolean NOT NULL DEFAULT false,
    deadline_at         timestamptz NOT NULL,
    result_ref          text,
    result_sha256       text,
    result_bytes        bigint,
    result_rows         integer,
    error_code          text,
    error_detail        text,
    replay_of           uuid REFERENCES export_jobs (id),
    trace_context       jsonb,
    created_at          timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    finished_at         timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT export_jobs_attempts_budget CHECK (attempts <= max_attempts),
    CONSTRAINT export_jobs_running_has_lease
        CHECK (status <> 'running' OR (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT export_jobs_succeeded_has_result
        CHECK (status <> 'succeeded' OR (result_ref IS NOT NULL AND result_sha256 IS NOT NULL))
);
-- the recovery-scanner's scans: queued jobs by due time, running jobs by lease expiry
CREATE INDEX export_jobs_queued_due_idx ON export_jobs (next_attempt_at) WHERE status = 'queued';
CREATE INDEX export_jobs_running_lease_idx ON export_jobs (lease_expires_at) WHERE status = 'running';
-- a tenant's jobs, newest first (GET /v1/exports)
CREATE INDEX export_jobs_tenant_created_idx ON export_jobs (tenant_id, created_at DESC, id DESC);
CREATE INDEX export_jobs_replay_of_idx ON export_jobs (replay_of) WHERE replay_of IS NOT NULL;

-- The immutable input of a job: the notes as they were when the job was accepted.
CREATE TABLE export_job_items (
    job_id      uuid NOT NULL REFERENCES export_jobs (id) ON DELETE CASCADE,
    ordinal     integer NOT NULL,
    note_id     bigint NOT NULL,
    title       text NOT NULL,
    content     text NOT NULL,
    pinned      boolean NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (job_id, ordinal)
);

CREATE TABLE export_outbox (
    id                uuid PRIMARY KEY,
    job_id            uuid NOT NULL REFERENCES export_jobs (id) ON DELETE CASCADE,
    queue             text NOT NULL,
    reason            text NOT NULL DEFAULT 'submit',
    available_at      timestamptz NOT NULL DEFAULT now(),
    claim_token       uuid,
    claimed_until     timestamptz,
    sent_at           timestamptz,
    publish_attempts  integer NOT NULL DEFAULT 0,
    last_error        text,
    trace_context     jsonb,
    created_at        timestamptz NOT NULL DEFAULT now()
);
-- pending events by due time (the publisher's claim) and by job (recovery's "has pending")
CREATE INDEX export_outbox_pending_idx ON export_outbox (available_at) WHERE sent_at IS NULL;
CREATE INDEX export_outbox_job_idx ON export_outbox (job_id);

-- Append-only history: one row per state change, written in the same transaction.
CREATE TABLE export_job_events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       uuid NOT NULL REFERENCES export_jobs (id) ON DELETE CASCADE,
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind         text NOT NULL,
    from_status  text,
    to_status    text,
    attempt      integer,
    lease_token  uuid,
    message_id   uuid,
    detail       jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX export_job_events_job_idx ON export_job_events (job_id, id);

CREATE FUNCTION exports_forbid_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is immutable: rows may be inserted or pruned, never updated', TG_TABLE_NAME
        USING ERRCODE = 'object_not_in_prerequisite_state';
END $$;
CREATE TRIGGER export_job_items_immutable BEFORE UPDATE ON export_job_items
    FOR EACH ROW EXECUTE FUNCTION exports_forbid_update();
CREATE TRIGGER export_job_events_append_only BEFORE UPDATE ON export_job_events
    FOR EACH ROW EXECUTE FUNCTION exports_forbid_update();
"""

DOWNGRADE = r"""
DROP TABLE IF EXISTS export_job_events;
DROP TABLE IF EXISTS export_outbox;
DROP TABLE IF EXISTS export_job_items;
DROP TABLE IF EXISTS export_jobs;
DROP FUNCTION IF EXISTS exports_forbid_update();
DROP TABLE IF EXISTS notes;
DROP TABLE IF EXISTS api_keys;
DROP TABLE IF EXISTS tenants;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
