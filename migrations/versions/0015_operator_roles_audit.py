"""Operators at scale: roles of operator keys, the audit trail, and bulk actions by filter.

- ``operator_keys.role``: ``viewer`` (reads everything, changes nothing) or ``admin``. Every
  key that exists when this revision runs becomes ``admin`` (the column's default fills
  them), so nobody loses what they could do; new keys name their role.
- ``operator_actions``: the audit trail. One row per action that changes something (a
  replay, a resolution, a cancel, a pause, a resume, a run now, a purge, a key change, a
  bulk action, a tenant's own cancel or webhook change), written in the same transaction as
  the action itself: the row is there, or the action did not happen. Who (the actor's kind,
  key id and name), what, its target, a bulk action's filter and count, the outcome, when.
  Rows are never deleted with the jobs they name (no foreign keys): the trail outlives the
  retention of what it describes, and is pruned after ``AUDIT_RETENTION_DAYS``.
- ``bulk_actions``: a cancel or replay of every job a filter matches, as a durable run: the
  filter, the instant its count was taken (``as_of``: rows that match only later are not
  acted on), the count the operator confirmed (never more are acted on), a keyset cursor,
  progress counters and a lease (a runner that dies leaves a run that any runner resumes
  once the lease expired). ``request_id`` makes the request idempotent: the same
  confirmation posted twice finds the run it started. Each batch advances the run, and its
  audit row's count, in the batch's own transaction.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE operator_keys
    ADD COLUMN role text NOT NULL DEFAULT 'admin' CHECK (role IN ('viewer', 'admin'));
COMMENT ON COLUMN operator_keys.role IS
    'viewer: reads everything, changes nothing; admin: every operator action';

CREATE TABLE operator_actions (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    actor_kind   text NOT NULL CHECK (actor_kind IN ('operator', 'tenant', 'database', 'system')),
    key_id       uuid,
    actor        text NOT NULL CHECK (length(actor) BETWEEN 1 AND 300),
    action       text NOT NULL CHECK (action ~ '^[a-z][a-z_]{0,62}$'),
    target_kind  text NOT NULL CHECK (target_kind ~ '^[a-z][a-z_]{0,62}$'),
    target_id    text,
    tenant_id    text,
    job_id       uuid,
    filter       jsonb,
    count        integer CHECK (count >= 0),
    outcome      text NOT NULL CHECK (outcome ~ '^[a-z][a-z_]{0,62}$'),
    detail       jsonb NOT NULL DEFAULT '{}'::jsonb
);
COMMENT ON TABLE operator_actions IS
    'the audit trail: one row per change, written in the transaction of the change itself';
CREATE INDEX operator_actions_at_idx ON operator_actions (at DESC, id DESC);
CREATE INDEX operator_actions_action_idx ON operator_actions (action, id DESC);
CREATE INDEX operator_actions_key_idx ON operator_actions (key_id, id DESC) WHERE key_id IS NOT NULL;
CREATE INDEX operator_actions_tenant_idx ON operator_actions (tenant_id, id DESC)
    WHERE tenant_id IS NOT NULL;
CREATE INDEX operator_actions_job_idx ON operator_actions (job_id, id) WHERE job_id IS NOT NULL;
CREATE INDEX operator_actions_target_idx ON operator_actions (target_kind, target_id, id DESC);

CREATE TABLE bulk_actions (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_id        uuid NOT NULL UNIQUE,
    kind              text NOT NULL CHECK (kind IN ('cancel', 'replay')),
    filter            jsonb NOT NULL,
    as_of             timestamptz NOT NULL,
    confirmed         integer NOT NULL CHECK (confirmed >= 0),
    state             text NOT NULL DEFAULT 'running'
                      CHECK (state IN ('running', 'done', 'stopped')),
    stop_reason       text,
    cursor            text,
    seen              integer NOT NULL DEFAULT 0 CHECK (seen >= 0),
    acted             integer NOT NULL DEFAULT 0 CHECK (acted >= 0),
    skipped           integer NOT NULL DEFAULT 0 CHECK (skipped >= 0),
    batches           integer NOT NULL DEFAULT 0 CHECK (batches >= 0),
    lease_token       uuid,
    lease_expires_at  timestamptz,
    audit_id          bigint NOT NULL REFERENCES operator_actions (id),
    actor             text NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz
);
COMMENT ON TABLE bulk_actions IS
    'a cancel or replay by filter: at most `confirmed` targets that matched at `as_of`, in batches';
CREATE INDEX bulk_actions_running_idx ON bulk_actions (lease_expires_at) WHERE state = 'running';
"""

DOWNGRADE = r"""
DROP TABLE IF EXISTS bulk_actions;
DROP TABLE IF EXISTS operator_actions;
ALTER TABLE operator_keys DROP COLUMN IF EXISTS role;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
