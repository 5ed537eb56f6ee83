"""The artifact store's own ETag of a published result (S3; NULL for the file backend).

Revision ID: 0004
Revises: 0002
Create Date: 2026-11-29

Chained to 0002 on the ``s3`` branch; when merged after ``0003`` (admission), set
``down_revision = "0003"`` so that the history stays linear.
"""

from alembic import op

revision = "0004"
down_revision = "0002"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE export_jobs ADD COLUMN result_etag text;
COMMENT ON COLUMN export_jobs.result_etag IS
    'ETag the artifact store returned for result_ref (S3 object ETag); NULL when the store has none';
"""

DOWNGRADE = r"""
ALTER TABLE export_jobs DROP COLUMN IF EXISTS result_etag;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
