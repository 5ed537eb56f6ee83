"""Schedules that spread out, cancel the export they supersede, and backfill a time range.

- ``export_schedules.jitter``: a bound in seconds (0-3600, 0 for every schedule that
  exists, so an upgrade changes nothing they do). ``jitter_offset``: the schedule's own
  delay within that bound, ``uuid_hash_extended(id) mod (jitter + 1)``, a stored generated
  column: it depends on the schedule's id and bound only, so it is the same in every process
  and after every restart, and PostgreSQL recomputes it whenever ``jitter`` changes. A slot
  fires at ``scheduled_at + jitter_offset``; the slot keeps its unjittered instant as its
  identity (``export_schedule_slots`` key), so one export per slot still holds.
- ``export_schedules.overlap`` takes ``cancel_other`` too: a slot that comes due while an
  earlier scheduled export is queued or running cancels it (the ordinary cancel statement)
  and runs.
- ``export_schedule_slots.backfilled_at``: when an explicit backfill created the slot's
  export (NULL otherwise). A backfill claims the same key as the rule's slot (trigger
  ``schedule``): a slot already created is never created again, a skipped one becomes
  created.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07
"""

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE export_schedules
    ADD COLUMN jitter integer NOT NULL DEFAULT 0 CHECK (jitter BETWEEN 0 AND 3600),
    ADD COLUMN jitter_offset integer NOT NULL GENERATED ALWAYS AS (
        (((uuid_hash_extended(id, 0) % (jitter + 1)) + (jitter + 1)) % (jitter + 1))::integer
    ) STORED;
COMMENT ON COLUMN export_schedules.jitter IS
    'seconds: each slot fires up to this much after its instant (a fixed offset per schedule)';
COMMENT ON COLUMN export_schedules.jitter_offset IS
    'seconds each slot of the schedule fires after its instant: a hash of the id within jitter';

ALTER TABLE export_schedules DROP CONSTRAINT export_schedules_overlap_check;
ALTER TABLE export_schedules ADD CONSTRAINT export_schedules_overlap_check
    CHECK (overlap IN ('skip', 'buffer_one', 'allow_all', 'cancel_other'));
COMMENT ON COLUMN export_schedules.overlap IS
    'while an earlier export of the schedule is queued or running: skip the slot, buffer_one '
    '(the latest due slot waits for it), allow_all, or cancel_other (cancel it and run)';

ALTER TABLE export_schedule_slots ADD COLUMN backfilled_at timestamptz;
COMMENT ON COLUMN export_schedule_slots.backfilled_at IS
    'when an explicit backfill created this slot''s export; NULL for the tick''s own slots';
"""

DOWNGRADE = r"""
ALTER TABLE export_schedule_slots DROP COLUMN backfilled_at;
UPDATE export_schedules SET overlap = 'skip' WHERE overlap = 'cancel_other';
ALTER TABLE export_schedules DROP CONSTRAINT export_schedules_overlap_check;
ALTER TABLE export_schedules ADD CONSTRAINT export_schedules_overlap_check
    CHECK (overlap IN ('skip', 'buffer_one', 'allow_all'));
COMMENT ON COLUMN export_schedules.overlap IS
    'while an earlier export of the schedule is queued or running: skip the slot, buffer_one '
    '(the latest due slot waits for it), or allow_all';
ALTER TABLE export_schedules DROP COLUMN jitter_offset, DROP COLUMN jitter;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
