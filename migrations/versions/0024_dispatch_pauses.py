"""Operators pause and resume dispatch of a queue, or of one tenant on a queue.

``dispatch_pauses`` holds one row per pause in force: the queue (``exports.fast`` /
``exports.bulk``), the tenant (NULL: every tenant of the queue), why (a required reason),
who and since when. A pause is a row, so it survives every process restart; the fair claim
(``outbox.sql`` ``outbox_mark_sent_and_claim_due``, run by the publishers and by the
workers' claims) reads the table once per statement and leaves the pending events of a
paused (tenant, queue) pair alone, so paused work waits in the outbox. At most one pause
per scope: the unique index treats NULL tenants as equal (``NULLS NOT DISTINCT``,
PostgreSQL 15). Who paused and resumed, and why, is in the audit trail
(``operator_actions``, written in the same transaction).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE dispatch_pauses (
    queue      text NOT NULL CHECK (queue IN ('exports.fast', 'exports.bulk')),
    tenant_id  text CHECK (tenant_id ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    reason     text NOT NULL CHECK (length(btrim(reason)) BETWEEN 1 AND 500),
    paused_by  text NOT NULL,
    paused_at  timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX dispatch_pauses_scope ON dispatch_pauses (queue, tenant_id) NULLS NOT DISTINCT;
COMMENT ON TABLE dispatch_pauses IS
    'dispatch paused by an operator: a queue (tenant_id NULL) or one tenant on it; the fair '
    'outbox claim skips the pending events of a paused pair';
"""

DOWNGRADE = r"""
DROP TABLE IF EXISTS dispatch_pauses;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
