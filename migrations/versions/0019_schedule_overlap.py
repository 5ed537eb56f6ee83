"""Schedule overlap policy: what a slot does while an earlier export of its schedule is still
queued or running.

- ``export_schedules.overlap``: ``skip`` (the slot is recorded skipped, reason ``overlap``),
  ``buffer_one`` (the latest due slot waits and runs once the earlier export ended; older
  waiting slots are skipped) or ``allow_all`` (every slot runs: what schedules did before).
  Schedules that exist keep ``allow_all``, so an upgrade changes nothing they do; a new
  schedule defaults to ``skip``.
- ``export_schedule_slots.reason``: why a slot was skipped: ``catch_up`` (missed, beyond the
  catch-up policy; every skipped slot so far) or ``overlap``; NULL for other outcomes.
- ``export_schedule_slots_jobs_idx``: a schedule's slots that created an export, newest
  first — the overlap check reads the recent ones with their jobs' status.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE export_schedules
    ADD COLUMN overlap text NOT NULL DEFAULT 'allow_all'
        CHECK (overlap IN ('skip', 'buffer_one', 'allow_all'));
ALTER TABLE export_schedules ALTER COLUMN overlap SET DEFAULT 'skip';
COMMENT ON COLUMN export_schedules.overlap IS
    'while an earlier export of the schedule is queued or running: skip the slot, buffer_one '
    '(the latest due slot waits for it), or allow_all';

ALTER TABLE export_schedule_slots
    ADD COLUMN reason text CHECK (reason IN ('catch_up', 'overlap')),
    ADD CONSTRAINT export_schedule_slots_reason_when_skipped
        CHECK ((outcome = 'skipped') = (reason IS NOT NULL)) NOT VALID;
UPDATE export_schedule_slots SET reason = 'catch_up' WHERE outcome = 'skipped';
ALTER TABLE export_schedule_slots VALIDATE CONSTRAINT export_schedule_slots_reason_when_skipped;
COMMENT ON COLUMN export_schedule_slots.reason IS
    'why a slot was skipped: catch_up (missed, beyond the catch-up policy) or overlap';

CREATE INDEX export_schedule_slots_jobs_idx
    ON export_schedule_slots (schedule_id, created_at DESC)
    WHERE job_id IS NOT NULL;
"""

DOWNGRADE = r"""
DROP INDEX IF EXISTS export_schedule_slots_jobs_idx;
ALTER TABLE export_schedule_slots
    DROP CONSTRAINT IF EXISTS export_schedule_slots_reason_when_skipped,
    DROP COLUMN reason;
ALTER TABLE export_schedules DROP COLUMN overlap;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
