-- Durable schedules: a cursor (next_due_at) per schedule, one slot row per scheduled instant.

-- name: schedule_insert
INSERT INTO export_schedules (
    id, tenant_id, name, cron, timezone, interval_seconds, payload, format, next_due_at,
    catch_up, max_catch_up, enabled)
VALUES (
    %(schedule_id)s, %(tenant_id)s, %(name)s, %(cron)s, %(timezone)s, %(interval_seconds)s,
    %(payload)s, %(format)s, %(next_due_at)s, %(catch_up)s, %(max_catch_up)s, %(enabled)s)
RETURNING *;

-- name: schedule_get_for_tenant
SELECT * FROM export_schedules WHERE id = %(schedule_id)s AND tenant_id = %(tenant_id)s;

-- name: schedule_lock_for_tenant
-- One schedule of the tenant, locked until the transaction ends: an edit merges its patch
-- into the row as it is (not as a concurrent edit or tick left it a moment ago).
SELECT * FROM export_schedules WHERE id = %(schedule_id)s AND tenant_id = %(tenant_id)s
FOR UPDATE;

-- name: schedule_list_for_tenant
SELECT * FROM export_schedules
WHERE tenant_id = %(tenant_id)s
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: schedule_update
-- Replace the editable fields of a tenant's schedule (the caller merged the patch and
-- recomputed the cursor when the rule changed).
UPDATE export_schedules
SET name = %(name)s, cron = %(cron)s, timezone = %(timezone)s,
    interval_seconds = %(interval_seconds)s, payload = %(payload)s, format = %(format)s,
    next_due_at = %(next_due_at)s, catch_up = %(catch_up)s, max_catch_up = %(max_catch_up)s,
    enabled = %(enabled)s, updated_at = now()
WHERE id = %(schedule_id)s AND tenant_id = %(tenant_id)s
RETURNING *;

-- name: schedule_delete
DELETE FROM export_schedules WHERE id = %(schedule_id)s AND tenant_id = %(tenant_id)s
RETURNING id;

-- name: schedule_due_ids
-- Enabled schedules whose cursor is due at `now` (each is then locked on its own).
SELECT id FROM export_schedules
WHERE enabled AND next_due_at <= %(now)s
ORDER BY next_due_at
LIMIT %(limit)s;

-- name: schedule_lock_due
-- Lock one due schedule for this tick; another tick holding it is skipped, not waited for.
SELECT * FROM export_schedules
WHERE id = %(schedule_id)s AND enabled AND next_due_at <= %(now)s
FOR UPDATE SKIP LOCKED;

-- name: slot_claim
-- Record a handled slot; no row back means the slot was already handled (never twice).
INSERT INTO export_schedule_slots (schedule_id, scheduled_at, outcome, job_id, detail)
VALUES (%(schedule_id)s, %(scheduled_at)s, %(outcome)s, %(job_id)s, %(detail)s)
ON CONFLICT (schedule_id, scheduled_at) DO NOTHING
RETURNING schedule_id, scheduled_at;

-- name: schedule_advance
-- Move the cursor (never backwards) and record the last admission refusal (or clear it).
UPDATE export_schedules
SET next_due_at = greatest(next_due_at, %(next_due_at)s), last_refusal = %(last_refusal)s,
    updated_at = now()
WHERE id = %(schedule_id)s
RETURNING *;

-- name: schedule_runs
-- A schedule's slots, newest first, with the state of each slot's job.
SELECT s.scheduled_at, s.outcome, s.job_id, s.detail, s.created_at, j.status AS job_status
FROM export_schedule_slots s
LEFT JOIN export_jobs j ON j.id = s.job_id
WHERE s.schedule_id = %(schedule_id)s
  AND (%(before)s::timestamptz IS NULL OR s.scheduled_at < %(before)s::timestamptz)
ORDER BY s.scheduled_at DESC
LIMIT %(limit)s;
