-- The audit trail (migration 0015): one row per change, written in the transaction of the
-- change itself by exportcore.audit.record. Rows are never changed, except the count,
-- outcome and detail of a bulk action while it runs, which each of its batches advances in
-- the batch's transaction; the database enforces it (migration 0021's trigger and role).
-- Reads are run unprepared (optional filters `(%(x)s IS NULL OR col = %(x)s)`).

-- name: operator_action_insert
INSERT INTO operator_actions (
    actor_kind, key_id, actor, action, target_kind, target_id, tenant_id, job_id, filter,
    count, outcome, detail)
VALUES (%(actor_kind)s, %(key_id)s, %(actor)s, %(action)s, %(target_kind)s, %(target_id)s,
        %(tenant_id)s, %(job_id)s, %(filter)s, %(count)s, %(outcome)s, %(detail)s)
RETURNING *;

-- name: operator_action_set_progress
-- A bulk action's row: how many targets it has acted on so far, and its outcome.
UPDATE operator_actions
SET count = %(count)s, outcome = %(outcome)s, detail = detail || %(detail)s
WHERE id = %(action_id)s
RETURNING id;

-- name: operator_action_get
SELECT * FROM operator_actions WHERE id = %(action_id)s;

-- name: operator_actions_page
-- Newest first after a keyset cursor (id), filtered by any of action, actor (the key's id),
-- tenant, target, job and a time range.
SELECT *
FROM operator_actions
WHERE (%(action)s::text IS NULL OR action = %(action)s::text)
  AND (%(key_id)s::uuid IS NULL OR key_id = %(key_id)s::uuid)
  AND (%(actor_kind)s::text IS NULL OR actor_kind = %(actor_kind)s::text)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)
  AND (%(target_kind)s::text IS NULL OR target_kind = %(target_kind)s::text)
  AND (%(target_id)s::text IS NULL OR target_id = %(target_id)s::text)
  AND (%(job_id)s::uuid IS NULL OR job_id = %(job_id)s::uuid)
  AND (%(since)s::timestamptz IS NULL OR at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR at < %(until)s::timestamptz)
  AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: operator_actions_for_job
-- What people did to one job, oldest first (its timeline shows them beside its history).
SELECT * FROM operator_actions WHERE job_id = %(job_id)s ORDER BY id LIMIT %(limit)s;

-- name: operator_action_delete_before
-- Retention: rows older than `retention_seconds` (at least 30 days), a bounded batch at a
-- time, never the row of a running bulk action (a finished one's run record goes with its
-- row). Only operator_actions_prune (migration 0021, SECURITY DEFINER) may delete audit
-- rows: the trigger refuses every other DELETE, and the processes' role has no DELETE.
SELECT p.id
FROM operator_actions_prune(make_interval(secs => %(retention_seconds)s), %(limit)s) AS p(id);
