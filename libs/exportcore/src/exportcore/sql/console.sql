-- The operator console's reads (services/api/console). Its actions write through the
-- library (exportcore.replays, exportcore.schedules, exportcore.submit); dead-letter states
-- are the columns of export_dead_letters (sql/dead_letters.sql). Every read is bounded (LIMIT, a time window, or a small set such as the active jobs) and
-- goes through an index (migration 0011; tests/integration/test_console_plans.py checks the
-- plans). Optional filters are `(%(x)s IS NULL OR col = %(x)s)`: the store runs these
-- statements unprepared, so PostgreSQL plans each with its actual values and the NULL
-- branches fold away (a cached generic plan could not use the indexes).

-- name: console_queue_counts
-- Active jobs per queue (the partial index of active jobs keeps this small).
SELECT queue,
       count(*) FILTER (WHERE status = 'queued') AS queued,
       count(*) FILTER (WHERE status = 'queued' AND next_attempt_at > now()) AS waiting_retry,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'running' AND lease_expires_at <= now()) AS expired_leases
FROM export_jobs
WHERE status IN ('queued', 'running')
GROUP BY queue;

-- name: console_finished_by_minute
-- Finished jobs per minute and queue over the last `minutes` minutes (the throughput
-- sparkline and the failed-in-the-last-hour counts), from export_jobs_finished_idx.
SELECT date_trunc('minute', finished_at) AS minute, queue,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled
FROM export_jobs
WHERE status IN ('succeeded', 'failed', 'cancelled')
  AND finished_at > date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
GROUP BY 1, 2
ORDER BY 1;

-- name: console_open_dead_letters
-- Dead letters in state `open` (neither replayed nor resolved): the `open` range of
-- export_dead_letters_state_idx (0007), read from the index alone.
SELECT count(*) AS open FROM export_dead_letters WHERE state = 'open';

-- name: console_jobs_page
-- Jobs newest first after a keyset cursor (created_at, id), filtered by any of state, queue,
-- tenant, error code, a created_at range and labels (tags and metadata pairs the job must
-- all carry: the containment export_jobs_labels_idx serves, migration 0025; read unprepared,
-- so planned for the values given). `progress` is the row count of the latest lease
-- renewal of a running job (the worker reports it at each chunk boundary).
SELECT j.id, j.tenant_id, j.status, j.queue, j.format, j.note_count, j.attempts,
       j.max_attempts, j.cancel_requested, j.error_code, j.created_at, j.started_at,
       j.finished_at, j.next_attempt_at, j.replay_of, p.progress,
       j.payload -> 'labels' AS labels
FROM export_jobs j
LEFT JOIN LATERAL (
    SELECT (e.detail ->> 'progress')::int AS progress
    FROM export_job_events e
    WHERE j.status = 'running' AND e.job_id = j.id AND e.kind = 'renewed'
    ORDER BY e.id DESC
    LIMIT 1
) p ON true
WHERE (%(status)s::text IS NULL OR j.status = %(status)s::text)
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s::text)
  AND (%(error_code)s::text IS NULL OR j.error_code = %(error_code)s::text)
  AND (%(created_from)s::timestamptz IS NULL OR j.created_at >= %(created_from)s::timestamptz)
  AND (%(created_to)s::timestamptz IS NULL OR j.created_at < %(created_to)s::timestamptz)
  AND (%(labels)s::jsonb IS NULL
       OR (j.payload ? 'labels' AND j.payload -> 'labels' @> %(labels)s::jsonb))
  AND (%(before_created_at)s::timestamptz IS NULL
       OR (j.created_at, j.id) < (%(before_created_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY j.created_at DESC, j.id DESC
LIMIT %(limit)s;

-- name: console_job
-- One job with its dead letter (its state, who replayed or resolved it and when), the
-- schedule slot that created it, its latest reported progress and whether its lease is
-- still valid.
SELECT j.*,
       j.lease_expires_at > now() AS lease_valid,
       d.id AS dead_letter_id, d.reason AS dead_letter_reason, d.detail AS dead_letter_detail,
       d.attempts AS dead_letter_attempts, d.created_at AS dead_lettered_at,
       d.state AS dead_letter_state, d.replay_job_id AS dead_letter_replay_id,
       d.replayed_at, d.replayed_by AS replay_requested_by,
       d.resolved_by, d.resolved_at, d.resolution_note,
       s.schedule_id, s.scheduled_at, s.trigger AS schedule_trigger,
       (SELECT (e.detail ->> 'progress')::int FROM export_job_events e
        WHERE e.job_id = j.id AND e.kind = 'renewed' ORDER BY e.id DESC LIMIT 1) AS progress
FROM export_jobs j
LEFT JOIN export_dead_letters d ON d.job_id = j.id
LEFT JOIN export_schedule_slots s ON s.job_id = j.id
WHERE j.id = %(job_id)s;

-- name: console_job_events
-- A job's history, oldest first, at most `limit` rows.
SELECT id, at, kind, from_status, to_status, attempt, lease_token, message_id, detail
FROM export_job_events
WHERE job_id = %(job_id)s
ORDER BY id
LIMIT %(limit)s;

-- name: console_replay_chain
-- The jobs a job was replayed from (depth < 0, nearest first) and the replays made of it
-- and of those replays (depth > 0), each hop a primary-key or replay_of index lookup.
WITH RECURSIVE up AS (
    SELECT j.replay_of AS id, -1 AS depth FROM export_jobs j
    WHERE j.id = %(job_id)s AND j.replay_of IS NOT NULL
    UNION ALL
    SELECT j.replay_of, up.depth - 1 FROM up JOIN export_jobs j ON j.id = up.id
    WHERE j.replay_of IS NOT NULL AND up.depth > -%(max_depth)s
), down AS (
    SELECT j.id, 1 AS depth FROM export_jobs j WHERE j.replay_of = %(job_id)s
    UNION ALL
    SELECT j.id, down.depth + 1 FROM down JOIN export_jobs j ON j.replay_of = down.id
    WHERE down.depth < %(max_depth)s
)
SELECT c.depth, j.id, j.status, j.error_code, j.attempts, j.created_at, j.finished_at
FROM (SELECT * FROM up UNION ALL SELECT * FROM down) c
JOIN export_jobs j ON j.id = c.id
ORDER BY c.depth, j.created_at;

-- name: console_dead_letter_groups
-- Dead letters per reason (one reason, or all when `reason` is NULL): all, and how many are
-- in each state (open / replayed / resolved), the tenants involved and the newest. One
-- index-only scan of export_dead_letters_groups_idx (0011: reason, state, with tenant and
-- time included); it reads every dead letter, which retention bounds.
SELECT reason,
       count(*) AS total,
       count(*) FILTER (WHERE state = 'open') AS open,
       count(*) FILTER (WHERE state = 'replayed') AS replayed,
       count(*) FILTER (WHERE state = 'resolved') AS resolved,
       count(DISTINCT tenant_id) AS tenants,
       max(created_at) AS newest
FROM export_dead_letters
WHERE (%(reason)s::text IS NULL OR reason = %(reason)s::text)
GROUP BY reason
ORDER BY open DESC, total DESC, reason;

-- name: console_schedules_page
-- Schedules by tenant (then newest first), one tenant or all, after a keyset cursor, each
-- with its `runs` latest slots and their jobs.
SELECT s.*, coalesce(runs.items, '[]'::jsonb) AS recent_runs
FROM export_schedules s
LEFT JOIN LATERAL (
    SELECT jsonb_agg(jsonb_build_object(
               'scheduled_at', sl.scheduled_at, 'trigger', sl.trigger, 'outcome', sl.outcome,
               'reason', sl.reason, 'job_id', sl.job_id, 'detail', sl.detail,
               'job_status', j.status)
           ORDER BY sl.scheduled_at DESC) AS items
    FROM (SELECT * FROM export_schedule_slots x WHERE x.schedule_id = s.id
          ORDER BY x.scheduled_at DESC LIMIT %(runs)s) sl
    LEFT JOIN export_jobs j ON j.id = sl.job_id
) runs ON true
WHERE (%(tenant_id)s::text IS NULL OR s.tenant_id = %(tenant_id)s::text)
  AND (%(after_tenant)s::text IS NULL
       OR s.tenant_id > %(after_tenant)s::text
       OR (s.tenant_id = %(after_tenant)s::text
           AND (s.created_at, s.id) < (%(after_created_at)s::timestamptz, %(after_id)s::uuid)))
ORDER BY s.tenant_id, s.created_at DESC, s.id DESC
LIMIT %(limit)s;

-- name: console_schedule
SELECT * FROM export_schedules WHERE id = %(schedule_id)s;

-- name: console_tenants_page
-- Tenants by id after a cursor, with their quota, active jobs and admission refusals of
-- the last hour (tenant_admission_refusals).
SELECT t.id, t.name, t.max_active_jobs, t.created_at,
       coalesce(t.max_active_jobs, %(default_quota)s) AS quota,
       a.queued, a.running, coalesce(rf.refused, 0) AS refused_last_hour,
       coalesce(rf.quota_refused, 0) AS quota_refused_last_hour,
       (SELECT count(*) FROM export_schedules s WHERE s.tenant_id = t.id) AS schedules
FROM tenants t
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE j.status = 'queued') AS queued,
           count(*) FILTER (WHERE j.status = 'running') AS running
    FROM export_jobs j
    WHERE j.tenant_id = t.id AND j.status IN ('queued', 'running')
) a
LEFT JOIN LATERAL (
    SELECT sum(x.refused) AS refused,
           sum(x.refused) FILTER (WHERE x.code = 'quota_exceeded') AS quota_refused
    FROM tenant_admission_refusals x
    WHERE x.tenant_id = t.id AND x.minute > now() - interval '1 hour'
) rf ON true
WHERE (%(after)s::text IS NULL OR t.id > %(after)s::text)
  AND (%(prefix)s::text IS NULL OR t.id LIKE %(prefix)s::text || '%%')
ORDER BY t.id
LIMIT %(limit)s;

-- name: console_reasons
-- The distinct dead-letter reasons (the error-code filter's suggestions): a loose index scan
-- of export_dead_letters_reason_idx, one probe per reason instead of reading every row.
WITH RECURSIVE r AS (
    (SELECT reason, 1 AS n FROM export_dead_letters ORDER BY reason LIMIT 1)
    UNION ALL
    SELECT (SELECT d.reason FROM export_dead_letters d WHERE d.reason > r.reason
            ORDER BY d.reason LIMIT 1), r.n + 1
    FROM r WHERE r.reason IS NOT NULL AND r.n < 200
)
SELECT reason FROM r WHERE reason IS NOT NULL;

-- name: console_jobs_by_id_range
-- Jobs whose id lies in [low, high] (an id's first characters, as searched from any page),
-- optionally ending in `suffix` (the short form "0190ab12…5e6f" the lists show), newest
-- first: a range scan of the primary key.
SELECT id, tenant_id, status, queue, note_count, created_at, error_code
FROM export_jobs
WHERE id BETWEEN %(low)s::uuid AND %(high)s::uuid
  AND (%(suffix)s::text IS NULL OR right(id::text, length(%(suffix)s::text)) = %(suffix)s::text)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: console_webhooks_page
-- Every tenant's webhook endpoints (one tenant, or all), by tenant then newest, after a
-- keyset cursor, with their health: the success rate of their last `sample` attempts (at
-- most the last 24 hours; webhook_attempts_endpoint_idx, newest first), the time of the
-- last attempt, and their pending messages (webhook_messages_due_idx).
SELECT e.id, e.tenant_id, e.url, e.description, e.events, e.enabled, e.consecutive_failures,
       e.failing_since, e.circuit_open_until, e.last_success_at, e.last_failure_at,
       e.last_error, e.disabled_reason, e.disabled_at, e.created_at,
       s.attempts, s.delivered, s.last_attempt_at,
       (SELECT count(*) FROM webhook_messages m
        WHERE m.endpoint_id = e.id AND m.status = 'pending') AS pending_messages
FROM webhook_endpoints e
CROSS JOIN LATERAL (
    SELECT count(*) AS attempts,
           count(*) FILTER (WHERE a.outcome = 'delivered') AS delivered,
           max(a.started_at) AS last_attempt_at
    FROM (SELECT x.outcome, x.started_at FROM webhook_attempts x
          WHERE x.endpoint_id = e.id AND x.started_at > now() - interval '24 hours'
          ORDER BY x.id DESC LIMIT %(sample)s) a
) s
WHERE (%(tenant_id)s::text IS NULL OR e.tenant_id = %(tenant_id)s::text)
  AND (%(after_tenant)s::text IS NULL
       OR e.tenant_id > %(after_tenant)s::text
       OR (e.tenant_id = %(after_tenant)s::text
           AND (e.created_at, e.id) < (%(after_created_at)s::timestamptz, %(after_id)s::uuid)))
ORDER BY e.tenant_id, e.created_at DESC, e.id DESC
LIMIT %(limit)s;

-- name: console_webhook
-- One endpoint of any tenant (never its secret), for its page.
SELECT e.id, e.tenant_id, e.url, e.description, e.events, e.enabled, e.consecutive_failures,
       e.failing_since, e.circuit_open_until, e.last_success_at, e.last_failure_at,
       e.last_error, e.disabled_reason, e.disabled_at, e.created_at,
       (SELECT count(*) FROM webhook_messages m
        WHERE m.endpoint_id = e.id AND m.status = 'pending') AS pending_messages
FROM webhook_endpoints e
WHERE e.id = %(endpoint_id)s;
