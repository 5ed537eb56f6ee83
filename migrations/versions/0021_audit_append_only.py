"""The audit trail becomes append-only in the database, and the processes get a role of
their own.

- Trigger ``operator_actions_append_only`` (``BEFORE UPDATE OR DELETE`` per row,
  ``BEFORE TRUNCATE`` per statement) refuses every change to an audit row, whoever asks —
  the owner and superusers included (they bypass privileges, not triggers) — with
  SQLSTATE 55000 (``object_not_in_prerequisite_state``, as the job history's trigger of
  revision 0001) and a message saying what is refused. Two changes are let through, and
  only those:

  * a bulk action's own row while it runs (``action`` ``bulk_…``, ``outcome`` ``running``):
    its ``count`` (never lower), ``outcome`` and ``detail``, as each batch advances it
    (``exportcore.audit.advance``); once it is ``done`` or ``stopped`` the row is sealed;
  * retention: rows older than 30 days (``AUDIT_RETENTION_DAYS`` may be no less) deleted by
    ``operator_actions_prune(retention, max_rows)``, which marks its own deletes
    (the function sets ``notes_exports.audit_prune``; a row younger than 30 days is never
    deleted, marked or not).

  What the trigger does not stop: an owner or a superuser can disable it (``ALTER TABLE
  operator_actions DISABLE TRIGGER``) or set the mark by hand. That is why the processes
  should not connect as the owner (below); docs/operations.md says so.
- Role ``notes_exports_app`` (NOLOGIN; created if missing, cluster-wide, never dropped by a
  downgrade since other databases of the cluster may use it): what the processes need and
  nothing more on the audit trail — ``SELECT``, ``INSERT`` and ``UPDATE`` of ``count``,
  ``outcome``, ``detail`` on ``operator_actions``, no ``DELETE``, no ``TRUNCATE``;
  ``SELECT, INSERT, UPDATE, DELETE`` on every other table (``SELECT`` only on
  ``alembic_version``), the sequences, and ``EXECUTE`` on ``operator_actions_prune``
  (a ``SECURITY DEFINER`` function: retention runs with the owner's right to delete, within
  the trigger's bounds). Tables created by later revisions (run by the same owner) get the
  same grants by default privileges. A deployment creates a login user for the processes
  that is a member of the role (``CREATE ROLE exports_app LOGIN PASSWORD … IN ROLE
  notes_exports_app``) and runs migrations as the owner.

  Creating the role needs ``CREATEROLE``. A migration user without it (a managed service's
  database owner, CloudNativePG's ``owner``) gets a WARNING and the trigger alone: a
  database administrator runs ``CREATE ROLE notes_exports_app NOLOGIN`` and the owner
  ``SELECT notes_exports_grant_app_role()`` (the grants above, in one function; true once
  granted), before or after the migration.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

UPGRADE = r"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'notes_exports_app') THEN
        BEGIN
            CREATE ROLE notes_exports_app NOLOGIN;
        EXCEPTION
            -- created meanwhile by the migration of another database of the cluster
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE WARNING 'revision 0021: % may not create the role notes_exports_app; the audit '
                    'trail is append-only by its trigger, but its role is not granted yet',
                    current_user
                    USING HINT = 'have a database administrator run "CREATE ROLE notes_exports_app '
                        'NOLOGIN", then run "SELECT notes_exports_grant_app_role()" as the '
                        'owner of the tables (docs/operations.md)';
        END;
    END IF;
END $$;

CREATE FUNCTION operator_actions_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF OLD.action LIKE 'bulk\_%' AND OLD.outcome = 'running'
           AND NEW.count >= coalesce(OLD.count, 0)
           AND (NEW.id, NEW.at, NEW.actor_kind, NEW.key_id, NEW.actor, NEW.action,
                NEW.target_kind, NEW.target_id, NEW.tenant_id, NEW.job_id, NEW.filter)
               IS NOT DISTINCT FROM
               (OLD.id, OLD.at, OLD.actor_kind, OLD.key_id, OLD.actor, OLD.action,
                OLD.target_kind, OLD.target_id, OLD.tenant_id, OLD.job_id, OLD.filter)
        THEN
            RETURN NEW;  -- a running bulk action's progress
        END IF;
        RAISE EXCEPTION 'operator_actions is the audit trail, append-only: row % may not be '
            'updated (only a running bulk action''s count, outcome and detail advance)', OLD.id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    ELSIF TG_OP = 'DELETE' THEN
        IF current_setting('notes_exports.audit_prune', true) = 'on'
           AND OLD.at < now() - interval '30 days' THEN
            RETURN OLD;  -- retention, by operator_actions_prune
        END IF;
        RAISE EXCEPTION 'operator_actions is the audit trail, append-only: row % may not be '
            'deleted (only operator_actions_prune removes rows, older than 30 days)',
            OLD.id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RAISE EXCEPTION 'operator_actions is the audit trail, append-only: % refused', TG_OP
        USING ERRCODE = 'object_not_in_prerequisite_state';
END $$;

CREATE TRIGGER operator_actions_append_only BEFORE UPDATE OR DELETE ON operator_actions
    FOR EACH ROW EXECUTE FUNCTION operator_actions_append_only();
CREATE TRIGGER operator_actions_no_truncate BEFORE TRUNCATE ON operator_actions
    FOR EACH STATEMENT EXECUTE FUNCTION operator_actions_append_only();

CREATE FUNCTION operator_actions_prune(retention interval, max_rows integer)
RETURNS SETOF bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public
SET notes_exports.audit_prune = 'on'
AS $$
DECLARE
    ids bigint[];
BEGIN
    IF retention IS NULL OR retention < interval '30 days' THEN
        RAISE EXCEPTION 'audit rows are kept at least 30 days; % asked', retention
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'set AUDIT_RETENTION_DAYS to 30 or more';
    END IF;
    SELECT coalesce(array_agg(s.id), '{}') INTO ids
    FROM (SELECT a.id FROM operator_actions a
          WHERE a.at < now() - retention
            AND NOT EXISTS (SELECT 1 FROM bulk_actions b WHERE b.audit_id = a.id
                            AND b.state = 'running')
          ORDER BY a.at
          LIMIT max_rows) s;
    -- a finished bulk action's run record goes with its audit row (it references it)
    DELETE FROM bulk_actions WHERE audit_id = ANY (ids);
    RETURN QUERY
    WITH gone AS (DELETE FROM operator_actions WHERE id = ANY (ids) RETURNING id)
    SELECT gone.id FROM gone;
END $$;
COMMENT ON FUNCTION operator_actions_prune(interval, integer) IS
    'retention of the audit trail: delete up to max_rows rows older than retention (at least '
    '30 days), never the row of a running bulk action; returns their ids';
REVOKE ALL ON FUNCTION operator_actions_prune(interval, integer) FROM PUBLIC;

CREATE FUNCTION notes_exports_grant_app_role() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'notes_exports_app') THEN
        RAISE WARNING 'there is no role notes_exports_app: nothing granted'
            USING HINT = 'a database administrator runs "CREATE ROLE notes_exports_app NOLOGIN" first';
        RETURN false;
    END IF;
    GRANT USAGE ON SCHEMA public TO notes_exports_app;
    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO notes_exports_app;
    GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO notes_exports_app;
    REVOKE INSERT, UPDATE, DELETE ON alembic_version FROM notes_exports_app;
    REVOKE UPDATE, DELETE, TRUNCATE ON operator_actions FROM notes_exports_app;
    GRANT UPDATE (count, outcome, detail) ON operator_actions TO notes_exports_app;
    GRANT EXECUTE ON FUNCTION operator_actions_prune(interval, integer) TO notes_exports_app;
    ALTER DEFAULT PRIVILEGES IN SCHEMA public
        GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO notes_exports_app;
    ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO notes_exports_app;
    RETURN true;
END $$;
COMMENT ON FUNCTION notes_exports_grant_app_role() IS
    'grant the processes'' role notes_exports_app what they need (revision 0021); run by the owner of '
    'the tables; false when the role does not exist';
REVOKE ALL ON FUNCTION notes_exports_grant_app_role() FROM PUBLIC;
SELECT notes_exports_grant_app_role();
"""

# The role stays: it is the cluster's, and other databases may hold grants to it.
DOWNGRADE = r"""
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'notes_exports_app') THEN
        ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE USAGE, SELECT ON SEQUENCES FROM notes_exports_app;
        ALTER DEFAULT PRIVILEGES IN SCHEMA public
            REVOKE SELECT, INSERT, UPDATE, DELETE ON TABLES FROM notes_exports_app;
        REVOKE ALL ON ALL TABLES IN SCHEMA public FROM notes_exports_app;
        REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM notes_exports_app;
        REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM notes_exports_app;
        REVOKE USAGE ON SCHEMA public FROM notes_exports_app;
    END IF;
END $$;
DROP FUNCTION IF EXISTS notes_exports_grant_app_role();
DROP FUNCTION IF EXISTS operator_actions_prune(interval, integer);
DROP TRIGGER IF EXISTS operator_actions_no_truncate ON operator_actions;
DROP TRIGGER IF EXISTS operator_actions_append_only ON operator_actions;
DROP FUNCTION IF EXISTS operator_actions_append_only();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
