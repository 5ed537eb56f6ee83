"""The backlog of each queue, read by the autoscaler: running and queued jobs per queue.

- ``export_jobs_backlog_idx``: (queue, status, next_attempt_at) of the queued and running
  jobs only. KEDA's postgresql trigger counts each queue's due queued and running jobs every
  polling interval (charts/notes-exports/files/keda/backlog.sql) with an index-only scan of
  it: the count never reads the table's rows and never walks finished jobs, however many
  there are. Its three columns are also the only ones the trigger's read-only role may read.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE INDEX export_jobs_backlog_idx
    ON export_jobs (queue, status, next_attempt_at)
    WHERE status IN ('queued', 'running');
"""

DOWNGRADE = r"""
DROP INDEX IF EXISTS export_jobs_backlog_idx;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
