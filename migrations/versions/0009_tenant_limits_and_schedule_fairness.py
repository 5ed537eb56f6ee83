"""Per-tenant submit rate overrides; schedules that back off, pause with a reason, and run
on demand.

- ``tenants.submit_rate`` / ``submit_burst``: the tenant's own token bucket (NULL: the
  settings' defaults), like ``max_active_jobs`` for the quota.
- ``export_schedules.retry_at`` / ``refusals``: a refused slot backs off (full jitter,
  capped); the tick skips the schedule until ``retry_at``.
- ``export_schedules.paused_reason`` / ``paused_detail`` / ``paused_at``: why a schedule is
  paused (the tick pauses one whose selection became invalid; a pause through the API says
  ``requested``). Pausing stays an UPDATE of ``enabled`` on the row.
- ``export_schedule_slots.trigger``: ``schedule`` for the rule's slots, ``manual`` for a
  "run now". The key becomes (schedule id, trigger, instant), so a manual run can never
  take, or be mistaken for, a scheduled slot whatever its instant.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE tenants
    ADD COLUMN submit_rate  double precision CHECK (submit_rate > 0),
    ADD COLUMN submit_burst integer CHECK (submit_burst >= 1);
COMMENT ON COLUMN tenants.submit_rate IS
    'submits per second the tenant may sustain (token bucket refill); NULL = TENANT_SUBMIT_RATE';
COMMENT ON COLUMN tenants.submit_burst IS
    'submits the tenant may make at once (bucket size); NULL = TENANT_SUBMIT_BURST';

ALTER TABLE export_schedules
    ADD COLUMN retry_at      timestamptz,
    ADD COLUMN refusals      integer NOT NULL DEFAULT 0 CHECK (refusals >= 0),
    ADD COLUMN paused_reason text,
    ADD COLUMN paused_detail text NOT NULL DEFAULT '',
    ADD COLUMN paused_at     timestamptz;
COMMENT ON COLUMN export_schedules.retry_at IS
    'after an admission refusal: the tick leaves the schedule alone until then (backoff)';
COMMENT ON COLUMN export_schedules.refusals IS
    'admission refusals in a row (0 after a slot is admitted); sets the backoff';
COMMENT ON COLUMN export_schedules.paused_reason IS
    'why the schedule is paused: requested, unknown_notes, invalid_selection; NULL when enabled';
UPDATE export_schedules SET paused_reason = 'requested', paused_at = updated_at WHERE NOT enabled;

-- The tick: enabled schedules by the instant they are next due (cursor, or the end of a
-- backoff), round-robin across tenants.
DROP INDEX export_schedules_due_idx;
CREATE INDEX export_schedules_due_idx
    ON export_schedules ((greatest(next_due_at, coalesce(retry_at, next_due_at))), tenant_id)
    WHERE enabled;

ALTER TABLE export_schedule_slots
    ADD COLUMN trigger text NOT NULL DEFAULT 'schedule' CHECK (trigger IN ('schedule', 'manual'));
ALTER TABLE export_schedule_slots DROP CONSTRAINT export_schedule_slots_pkey;
ALTER TABLE export_schedule_slots ADD PRIMARY KEY (schedule_id, trigger, scheduled_at);
CREATE INDEX export_schedule_slots_recent_idx
    ON export_schedule_slots (schedule_id, scheduled_at DESC);
"""

DOWNGRADE = r"""
DROP INDEX IF EXISTS export_schedule_slots_recent_idx;
DELETE FROM export_schedule_slots WHERE trigger = 'manual';
ALTER TABLE export_schedule_slots DROP CONSTRAINT export_schedule_slots_pkey;
ALTER TABLE export_schedule_slots ADD PRIMARY KEY (schedule_id, scheduled_at);
ALTER TABLE export_schedule_slots DROP COLUMN trigger;

DROP INDEX export_schedules_due_idx;
CREATE INDEX export_schedules_due_idx ON export_schedules (next_due_at) WHERE enabled;
ALTER TABLE export_schedules
    DROP COLUMN paused_at,
    DROP COLUMN paused_detail,
    DROP COLUMN paused_reason,
    DROP COLUMN refusals,
    DROP COLUMN retry_at;

ALTER TABLE tenants DROP COLUMN submit_burst, DROP COLUMN submit_rate;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
