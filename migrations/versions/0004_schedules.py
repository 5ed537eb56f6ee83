"""Durable schedules: a cursor per schedule and one slot row per scheduled instant.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE export_schedules (
    id                uuid PRIMARY KEY,
    tenant_id         text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name              text NOT NULL DEFAULT '',
    cron              text,
    timezone          text,
    interval_seconds  integer CHECK (interval_seconds > 0),
    payload           jsonb NOT NULL,
    format            text NOT NULL CHECK (format IN ('json', 'ndjson', 'markdown_zip')),
    -- the durable cursor: the next scheduled instant (UTC) not yet turned into a job
    next_due_at       timestamptz NOT NULL,
    catch_up          text NOT NULL CHECK (catch_up IN ('skip', 'all')),
    max_catch_up      integer NOT NULL DEFAULT 10 CHECK (max_catch_up BETWEEN 1 AND 1000),
    enabled           boolean NOT NULL DEFAULT true,
    last_refusal      jsonb,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT export_schedules_one_rule CHECK (
        (cron IS NOT NULL AND timezone IS NOT NULL AND interval_seconds IS NULL)
        OR (cron IS NULL AND timezone IS NULL AND interval_seconds IS NOT NULL))
);
-- the tick: enabled schedules by cursor
CREATE INDEX export_schedules_due_idx ON export_schedules (next_due_at) WHERE enabled;
CREATE INDEX export_schedules_tenant_idx ON export_schedules (tenant_id, created_at DESC, id DESC);

-- One row per scheduled instant that was handled: the unique key is what makes a slot
-- produce at most one job however many ticks, beats or redeliveries arrive.
CREATE TABLE export_schedule_slots (
    schedule_id   uuid NOT NULL REFERENCES export_schedules (id) ON DELETE CASCADE,
    scheduled_at  timestamptz NOT NULL,
    outcome       text NOT NULL CHECK (outcome IN ('created', 'skipped', 'invalid')),
    -- deferred: the slot is claimed first in the tick transaction, its job written after
    job_id        uuid REFERENCES export_jobs (id) ON DELETE SET NULL DEFERRABLE INITIALLY DEFERRED,
    detail        text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_id, scheduled_at)
);
CREATE INDEX export_schedule_slots_job_idx ON export_schedule_slots (job_id) WHERE job_id IS NOT NULL;
"""

DOWNGRADE = r"""
DROP TABLE IF EXISTS export_schedule_slots;
DROP TABLE IF EXISTS export_schedules;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
