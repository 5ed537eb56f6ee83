-- Durable schedules: a cursor (next_due_at) per schedule, one slot row per scheduled instant.

-- name: schedule_insert
-- A schedule created paused says so like one paused later (paused_reason 'requested').
-- jitter_offset is generated from the id and jitter (migration 0026).
INSERT INTO export_schedules (
    id, tenant_id, name, cron, timezone, interval_seconds, payload, format, next_due_at,
    catch_up, max_catch_up, overlap, jitter, enabled, paused_reason, paused_at)
VALUES (
    %(schedule_id)s, %(tenant_id)s, %(name)s, %(cron)s, %(timezone)s, %(interval_seconds)s,
    %(payload)s, %(format)s, %(next_due_at)s, %(catch_up)s, %(max_catch_up)s, %(overlap)s,
    %(jitter)s, %(enabled)s,
    CASE WHEN %(enabled)s THEN NULL ELSE 'requested' END,
    CASE WHEN %(enabled)s THEN NULL ELSE now() END)
RETURNING *;

-- name: schedule_tenant_lock
-- Serialise schedule creation per tenant (transaction-scoped), so that the count below and
-- the insert after it cannot let two concurrent creates pass the cap together. Its own
-- statement: a statement's snapshot is taken before it waits for the lock.
SELECT pg_advisory_xact_lock(hashtextextended('exports:schedules:' || %(tenant_id)s, 0));

-- name: schedule_count_for_tenant
SELECT count(*) AS n FROM export_schedules WHERE tenant_id = %(tenant_id)s;

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
-- recomputed the cursor when the rule changed). Pausing records why and when (kept while it
-- stays paused); resuming clears the reason and any backoff.
UPDATE export_schedules
SET name = %(name)s, cron = %(cron)s, timezone = %(timezone)s,
    interval_seconds = %(interval_seconds)s, payload = %(payload)s, format = %(format)s,
    next_due_at = %(next_due_at)s, catch_up = %(catch_up)s, max_catch_up = %(max_catch_up)s,
    overlap = %(overlap)s, jitter = %(jitter)s, enabled = %(enabled)s,
    paused_reason = CASE WHEN %(enabled)s THEN NULL
                         WHEN enabled THEN 'requested' ELSE paused_reason END,
    paused_detail = CASE WHEN %(enabled)s OR enabled THEN '' ELSE paused_detail END,
    paused_at = CASE WHEN %(enabled)s THEN NULL WHEN enabled THEN now() ELSE paused_at END,
    retry_at = CASE WHEN %(enabled)s AND NOT enabled THEN NULL ELSE retry_at END,
    refusals = CASE WHEN %(enabled)s AND NOT enabled THEN 0 ELSE refusals END,
    updated_at = now()
WHERE id = %(schedule_id)s AND tenant_id = %(tenant_id)s
RETURNING *;

-- name: schedule_delete
DELETE FROM export_schedules WHERE id = %(schedule_id)s AND tenant_id = %(tenant_id)s
RETURNING id;

-- name: schedule_due_ids
-- Enabled schedules due at `now` (cursor reached and no backoff pending), shared across
-- tenants round-robin: every tenant's most overdue schedule first, then every tenant's
-- second, and so on, so one tenant's many due schedules never fill the batch alone. The
-- window reads every due schedule, which the per-tenant cap bounds. A slot fires
-- jitter_offset seconds after its instant; the unjittered condition (never later than the
-- jittered one) is what export_schedules_due_idx serves, the jittered one then filters.
WITH due AS (
    SELECT id, tenant_id,
           greatest(next_due_at + make_interval(secs => jitter_offset),
                    coalesce(retry_at, next_due_at)) AS due_at
    FROM export_schedules
    WHERE enabled AND greatest(next_due_at, coalesce(retry_at, next_due_at)) <= %(now)s
)
SELECT id, tenant_id FROM (
    SELECT id, tenant_id, due_at,
           row_number() OVER (PARTITION BY tenant_id ORDER BY due_at, id) AS turn
    FROM due
    WHERE due_at <= %(now)s
) ranked
ORDER BY turn, due_at, id
LIMIT %(limit)s;

-- name: schedule_lock_due
-- Lock one due schedule for this tick; another tick holding it is skipped, not waited for.
-- Due means its cursor's slot plus its jitter offset has come.
SELECT * FROM export_schedules
WHERE id = %(schedule_id)s AND enabled
  AND next_due_at + make_interval(secs => jitter_offset) <= %(now)s
  AND (retry_at IS NULL OR retry_at <= %(now)s)
FOR UPDATE SKIP LOCKED;

-- name: slot_claim
-- Record a handled slot; no row back means the slot was already handled (never twice).
-- A manual run ("run now") is a slot of trigger 'manual' at the instant of its request:
-- the key includes the trigger, so it never takes a scheduled slot's place. A skipped slot
-- says why (reason catch_up or overlap).
INSERT INTO export_schedule_slots (
    schedule_id, trigger, scheduled_at, outcome, job_id, detail, reason)
VALUES (
    %(schedule_id)s, %(trigger)s, %(scheduled_at)s, %(outcome)s, %(job_id)s, %(detail)s,
    %(reason)s)
ON CONFLICT (schedule_id, trigger, scheduled_at) DO NOTHING
RETURNING schedule_id, trigger, scheduled_at;

-- name: schedule_advance
-- Move the cursor (never backwards); a slot went through, so any refusal and backoff end.
UPDATE export_schedules
SET next_due_at = greatest(next_due_at, %(next_due_at)s), last_refusal = NULL,
    refusals = 0, retry_at = NULL, updated_at = now()
WHERE id = %(schedule_id)s
RETURNING *;

-- name: schedule_refuse
-- Admission refused the schedule's due slot: the cursor stays on it, the refusal is shown,
-- and the tick leaves the schedule alone until retry_at (the caller's backoff).
UPDATE export_schedules
SET refusals = refusals + 1, retry_at = %(retry_at)s, last_refusal = %(last_refusal)s,
    updated_at = now()
WHERE id = %(schedule_id)s
RETURNING *;

-- name: schedule_pause
-- The tick pauses a schedule whose selection became invalid (notes deleted): an UPDATE of
-- `enabled` with the reason kept on the row, so a trigger or a reader can tell why.
UPDATE export_schedules
SET enabled = false, paused_reason = %(reason)s, paused_detail = %(detail)s,
    paused_at = %(now)s, updated_at = now()
WHERE id = %(schedule_id)s AND enabled
RETURNING *;

-- name: schedule_tenant_headroom
-- The tenant's active jobs against its quota: read before a scheduled slot copies its
-- snapshot, so a tenant at its quota is refused cheaply (admission still decides).
SELECT coalesce(t.max_active_jobs, %(default_quota)s) AS quota,
       (SELECT count(*) FROM export_jobs j
        WHERE j.tenant_id = t.id AND j.status IN ('queued', 'running')) AS active
FROM tenants t
WHERE t.id = %(tenant_id)s;

-- name: schedule_runs
-- A schedule's slots, newest first, with the state of each slot's job.
SELECT s.scheduled_at, s.trigger, s.outcome, s.reason, s.job_id, s.detail, s.created_at,
       s.backfilled_at, j.status AS job_status
FROM export_schedule_slots s
LEFT JOIN export_jobs j ON j.id = s.job_id
WHERE s.schedule_id = %(schedule_id)s
  AND (%(before)s::timestamptz IS NULL OR s.scheduled_at < %(before)s::timestamptz)
ORDER BY s.scheduled_at DESC, s.trigger
LIMIT %(limit)s;

-- name: schedule_active_job
-- The schedule's oldest export still queued or running (scheduled or run by hand), or no
-- row: what the overlap policy asks before a slot runs. Only exports created in the last
-- `window_seconds` are looked at (export_schedule_slots_jobs_idx): an older one is past its
-- deadline, and the recovery-scanner fails it.
SELECT j.id, j.status, s.scheduled_at
FROM export_schedule_slots s
JOIN export_jobs j ON j.id = s.job_id
WHERE s.schedule_id = %(schedule_id)s AND s.job_id IS NOT NULL
  AND s.created_at > now() - make_interval(secs => %(window_seconds)s)
  AND j.status IN ('queued', 'running')
ORDER BY s.created_at
LIMIT 1;

-- name: schedule_recent_succeeded
-- An incremental schedule's chain (exportcore.schedules.ticker.slot_request): its latest
-- succeeded exports of all notes, newest first, with their base (NULL for a full export).
SELECT j.id, j.base_job_id, j.format, j.created_at
FROM export_schedule_slots s
JOIN export_jobs j ON j.id = s.job_id
WHERE s.schedule_id = %(schedule_id)s AND j.status = 'succeeded'
ORDER BY j.created_at DESC, j.id DESC
LIMIT %(limit)s;


-- name: schedule_active_slot_jobs
-- overlap cancel_other: the exports of the schedule's own slots (trigger 'schedule', not
-- backfilled) still queued or running, oldest first, which a newer slot supersedes. A manual
-- run or a backfill is an explicit request and is never cancelled by a slot. The same window
-- as schedule_active_job.
SELECT j.id, j.status, s.scheduled_at
FROM export_schedule_slots s
JOIN export_jobs j ON j.id = s.job_id
WHERE s.schedule_id = %(schedule_id)s AND s.job_id IS NOT NULL
  AND s.trigger = 'schedule' AND s.backfilled_at IS NULL
  AND s.created_at > now() - make_interval(secs => %(window_seconds)s)
  AND j.status IN ('queued', 'running')
ORDER BY s.created_at
LIMIT %(limit)s;

-- name: schedule_lock_for_backfill
-- The schedule a backfill reads its rule from, locked until the slot's transaction ends (as a
-- tick locks it): an edit of the rule waits, and never interleaves with a slot's claim.
SELECT * FROM export_schedules WHERE id = %(schedule_id)s FOR UPDATE;

-- name: slot_claim_backfill
-- A backfill's claim of a rule's slot (trigger 'schedule'): the slot is recorded created
-- with its new export, or a slot recorded skipped or invalid (missed, overlap, a selection
-- since fixed) becomes created; a slot that already created an export matches nothing, so
-- no slot ever has two exports (the key, and the row lock of ON CONFLICT, serialise a tick
-- and concurrent backfills). created_at becomes now: the overlap checks see the export.
INSERT INTO export_schedule_slots AS s (
    schedule_id, trigger, scheduled_at, outcome, job_id, detail, reason, backfilled_at)
VALUES (
    %(schedule_id)s, 'schedule', %(scheduled_at)s, 'created', %(job_id)s, %(detail)s, NULL,
    now())
ON CONFLICT (schedule_id, trigger, scheduled_at) DO UPDATE
SET outcome = 'created', job_id = EXCLUDED.job_id,
    detail = EXCLUDED.detail || ' (was ' || s.outcome
             || coalesce(': ' || s.reason, '') || ')',
    reason = NULL, backfilled_at = now(), created_at = now()
WHERE s.outcome <> 'created'
RETURNING schedule_id, trigger, scheduled_at;

-- name: slot_get
-- One slot of a schedule with its export's status (what a backfill reports for a slot
-- already created).
SELECT s.scheduled_at, s.outcome, s.job_id, j.status AS job_status
FROM export_schedule_slots s
LEFT JOIN export_jobs j ON j.id = s.job_id
WHERE s.schedule_id = %(schedule_id)s AND s.trigger = %(trigger)s
  AND s.scheduled_at = %(scheduled_at)s;
