"""Dead letters, recovery-scanner indexes, and replays that survive pruning of the original.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE export_dead_letters (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      uuid NOT NULL UNIQUE REFERENCES export_jobs (id) ON DELETE CASCADE,
    tenant_id   text NOT NULL,
    reason      text NOT NULL,
    detail      text NOT NULL DEFAULT '',
    attempts    integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
-- the admin listing: newest first, optionally by reason
CREATE INDEX export_dead_letters_reason_idx ON export_dead_letters (reason, id DESC);
-- terminal jobs by finish time (retention pruning)
CREATE INDEX export_jobs_finished_idx ON export_jobs (finished_at)
    WHERE status IN ('succeeded', 'failed', 'cancelled');
-- sent outbox events by send time (retention pruning)
CREATE INDEX export_outbox_sent_idx ON export_outbox (sent_at) WHERE sent_at IS NOT NULL;
-- the scanner's queued rules: cancel requests and deadlines of queued jobs
CREATE INDEX export_jobs_queued_cancel_idx ON export_jobs (id)
    WHERE status = 'queued' AND cancel_requested;
CREATE INDEX export_jobs_queued_deadline_idx ON export_jobs (deadline_at) WHERE status = 'queued';
-- a replay keeps pointing at its original only while the original exists
ALTER TABLE export_jobs DROP CONSTRAINT export_jobs_replay_of_fkey,
    ADD CONSTRAINT export_jobs_replay_of_fkey FOREIGN KEY (replay_of)
        REFERENCES export_jobs (id) ON DELETE SET NULL;
"""

DOWNGRADE = r"""
ALTER TABLE export_jobs DROP CONSTRAINT export_jobs_replay_of_fkey,
    ADD CONSTRAINT export_jobs_replay_of_fkey FOREIGN KEY (replay_of) REFERENCES export_jobs (id);
DROP INDEX IF EXISTS export_jobs_queued_deadline_idx;
DROP INDEX IF EXISTS export_jobs_queued_cancel_idx;
DROP INDEX IF EXISTS export_outbox_sent_idx;
DROP INDEX IF EXISTS export_jobs_finished_idx;
DROP TABLE IF EXISTS export_dead_letters;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
