-- Bulk actions by filter (migration 0015): a durable run of "cancel (or replay) every job
-- this filter matched at `as_of`, at most `confirmed` of them", in keyset batches under a
-- lease. The targets are acted on through the same guarded statements as single actions
-- (jobs.sql job_request_cancel_many, the replay path of exportcore.replays), so a bulk
-- action racing single ones acts on each job once.

-- fragment: bulk_action_cancel_match
-- The jobs a bulk cancel may act on (`j`): active, no cancel requested yet, created by
-- `as_of`, matching the filter. Reads export_jobs_active_idx (few rows: active jobs only).
j.status IN ('queued', 'running') AND NOT j.cancel_requested
  AND j.created_at <= %(as_of)s::timestamptz
  AND (%(status)s::text IS NULL OR j.status = %(status)s::text)
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s::text)
  AND (%(created_from)s::timestamptz IS NULL OR j.created_at >= %(created_from)s::timestamptz)
  AND (%(created_to)s::timestamptz IS NULL OR j.created_at < %(created_to)s::timestamptz)

-- fragment: bulk_action_replay_match
-- The dead letters a bulk replay may act on (`d`, their job `j`): open, dead-lettered by
-- `as_of`, matching the filter (`reason` is the job's error code). Reads
-- export_dead_letters_state_idx (state, reason, id).
d.state = 'open'
  AND d.created_at <= %(as_of)s::timestamptz
  AND (%(reason)s::text IS NULL OR d.reason = %(reason)s::text)
  AND (%(tenant_id)s::text IS NULL OR d.tenant_id = %(tenant_id)s::text)
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(created_from)s::timestamptz IS NULL OR j.created_at >= %(created_from)s::timestamptz)
  AND (%(created_to)s::timestamptz IS NULL OR j.created_at < %(created_to)s::timestamptz)

-- name: bulk_action_cancel_count
SELECT count(*) AS n FROM export_jobs j WHERE {{bulk_action_cancel_match}};

-- name: bulk_action_cancel_targets
-- The next batch after the cursor (job id), in id order.
SELECT j.id, j.tenant_id FROM export_jobs j
WHERE {{bulk_action_cancel_match}}
  AND (%(after)s::uuid IS NULL OR j.id > %(after)s::uuid)
ORDER BY j.id
LIMIT %(limit)s;

-- name: bulk_action_replay_count
SELECT count(*) AS n
FROM export_dead_letters d JOIN export_jobs j ON j.id = d.job_id
WHERE {{bulk_action_replay_match}};

-- name: bulk_action_replay_targets
-- The next batch after the cursor (dead letter id), oldest first.
SELECT d.id, d.job_id, d.tenant_id
FROM export_dead_letters d JOIN export_jobs j ON j.id = d.job_id
WHERE {{bulk_action_replay_match}}
  AND d.id > coalesce(%(after)s::bigint, 0)
ORDER BY d.id
LIMIT %(limit)s;

-- name: bulk_action_insert
-- A new run, or nothing when this request id already started one (the same confirmation
-- posted twice): the caller then reads that one.
INSERT INTO bulk_actions (request_id, kind, filter, as_of, confirmed, audit_id, actor)
VALUES (%(request_id)s, %(kind)s, %(filter)s, %(as_of)s, %(confirmed)s, %(audit_id)s,
        %(actor)s)
ON CONFLICT (request_id) DO NOTHING
RETURNING *;

-- fragment: bulk_action_row
-- A run with `interrupted`: running, and nobody renews its lease (it expired, or no runner
-- took a run written 30 s ago): what a resume is for.
SELECT b.*,
       (b.state = 'running'
        AND coalesce(b.lease_expires_at, b.created_at + interval '30 seconds') < now())
           AS interrupted
FROM bulk_actions b

-- name: bulk_action_get
{{bulk_action_row}}
WHERE b.id = %(bulk_id)s;

-- name: bulk_action_get_by_request
{{bulk_action_row}}
WHERE b.request_id = %(request_id)s;

-- name: bulk_action_claim
-- Take the run's lease: a new run, or one whose runner went silent (lease expired). A
-- run with a valid lease, or finished, matches nothing.
UPDATE bulk_actions
SET lease_token = %(lease_token)s,
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    updated_at = now()
WHERE id = %(bulk_id)s AND state = 'running'
  AND (lease_expires_at IS NULL OR lease_expires_at < now())
RETURNING *;

-- name: bulk_action_advance
-- One batch done, in the batch's transaction: the cursor, the counters, a renewed lease;
-- and the run's end (`state` done or stopped, with why). Guarded by the lease token: a
-- runner that lost its lease matches nothing, and its batch rolls back.
UPDATE bulk_actions
SET cursor = %(cursor)s,
    seen = seen + %(seen)s,
    acted = acted + %(acted)s,
    skipped = skipped + %(skipped)s,
    batches = batches + 1,
    state = %(state)s,
    stop_reason = %(stop_reason)s,
    lease_expires_at = CASE WHEN %(state)s = 'running'
                            THEN now() + make_interval(secs => %(lease_seconds)s) END,
    lease_token = CASE WHEN %(state)s = 'running' THEN lease_token END,
    finished_at = CASE WHEN %(state)s = 'running' THEN NULL ELSE now() END,
    updated_at = now()
WHERE id = %(bulk_id)s AND state = 'running' AND lease_token = %(lease_token)s
RETURNING *;

-- name: bulk_action_running
-- Runs whose lease expired (their runner died): what a runner may resume.
SELECT id FROM bulk_actions
WHERE state = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < now())
ORDER BY id
LIMIT %(limit)s;
