"""Recovery origin of a requeued job, for the recovery-duration metric.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UPGRADE = r"""
-- Set when the recovery-scanner requeues an expired lease (lease_expiry, from the expired
-- lease's end) or re-dispatches a lost message (lost_dispatch, from the last dispatch);
-- read by the next claim, which reports the time to recovery; cleared by a normal retry.
ALTER TABLE export_jobs
    ADD COLUMN recovery_kind text CHECK (recovery_kind IN ('lease_expiry', 'lost_dispatch')),
    ADD COLUMN recovery_started_at timestamptz;
"""

DOWNGRADE = r"""
ALTER TABLE export_jobs DROP COLUMN IF EXISTS recovery_kind,
    DROP COLUMN IF EXISTS recovery_started_at;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
