"""The artifact store's own ETag of a published result (S3; NULL for the file backend).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from alembic import op

revision = "0006"
down_revision = "0005"
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
