-- Job transitions. Every statement that changes a job is guarded by its current state (and,
-- for a running job, by its lease token), writes one history event in the same statement,
-- and returns the changed row: no row back means the transition was refused.

-- name: job_submit
-- A new queued job, its first outbox event and its `submitted` event, in one statement.
-- The snapshot items are inserted next, in the same transaction (job_snapshot_*).
WITH job AS (
    INSERT INTO export_jobs (
        id, tenant_id, status, queue, format, payload, note_count, request_hash,
        idempotency_key, max_attempts, deadline_at, replay_of, trace_context)
    VALUES (
        %(job_id)s, %(tenant_id)s, 'queued', %(queue)s, %(format)s, %(payload)s, %(note_count)s,
        %(request_hash)s, %(idempotency_key)s, %(max_attempts)s,
        now() + make_interval(secs => %(deadline_seconds)s), %(replay_of)s, %(trace_context)s)
    RETURNING *
), outbox AS (
    INSERT INTO export_outbox (id, job_id, queue, reason, trace_context)
    SELECT %(message_id)s, job.id, job.queue, 'submit', job.trace_context FROM job
    RETURNING id
), history AS (
    INSERT INTO export_job_events (job_id, kind, to_status, message_id, detail)
    SELECT job.id, 'submitted', 'queued', %(message_id)s, %(event_detail)s FROM job
)
SELECT job.*, (SELECT id FROM outbox) AS message_id,
       pg_notify('export_outbox', job.queue)::text AS notified
FROM job;

-- name: job_snapshot_notes
-- Copy the selected notes of the tenant into the job's immutable snapshot, in note id order.
INSERT INTO export_job_items (job_id, ordinal, note_id, title, content, pinned, updated_at)
SELECT %(job_id)s, row_number() OVER (ORDER BY n.id), n.id, n.title, n.content, n.pinned, n.updated_at
FROM notes n
WHERE n.tenant_id = %(tenant_id)s AND n.id = ANY(%(note_ids)s::bigint[]);

-- name: job_snapshot_all_notes
-- Copy every note of the tenant into the job's immutable snapshot, in note id order.
INSERT INTO export_job_items (job_id, ordinal, note_id, title, content, pinned, updated_at)
SELECT %(job_id)s, row_number() OVER (ORDER BY n.id), n.id, n.title, n.content, n.pinned, n.updated_at
FROM notes n
WHERE n.tenant_id = %(tenant_id)s;

-- name: job_claim
-- queued -> running. Only a due, uncancelled job with attempts and time left; issues a fresh
-- lease token and consumes one attempt. A duplicate or early message matches nothing.
WITH claimed AS (
    UPDATE export_jobs
    SET status = 'running',
        attempts = attempts + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
        started_at = coalesce(started_at, now()),
        error_code = NULL,
        error_detail = NULL,
        updated_at = now()
    WHERE id = %(job_id)s
      AND status = 'queued'
      AND next_attempt_at <= now()
      AND NOT cancel_requested
      AND deadline_at > now()
      AND attempts < max_attempts
    RETURNING *
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt, lease_token, message_id)
    SELECT id, 'claimed', 'queued', 'running', attempts, lease_token, %(message_id)s FROM claimed
)
SELECT *, extract(epoch FROM deadline_at - now())::float8 AS seconds_to_deadline FROM claimed;

-- name: job_claim_refusal
-- Why a claim matched nothing (read only, on the refusal path).
SELECT id, status, queue, attempts, max_attempts, cancel_requested, lease_expires_at,
       next_attempt_at > now() AS not_due,
       deadline_at <= now() AS past_deadline,
       lease_expires_at > now() AS lease_valid
FROM export_jobs
WHERE id = %(job_id)s;

-- name: job_renew_lease
-- Extend the lease of a running job, only by its current holder and only before expiry.
WITH renewed AS (
    UPDATE export_jobs
    SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), updated_at = now()
    WHERE id = %(job_id)s
      AND status = 'running'
      AND lease_token = %(lease_token)s
      AND lease_expires_at > now()
      AND NOT cancel_requested
      AND deadline_at > now()
    RETURNING *
), history AS (
    INSERT INTO export_job_events (job_id, kind, attempt, lease_token, detail)
    SELECT id, 'renewed', attempts, lease_token,
           jsonb_build_object('lease_expires_at', lease_expires_at, 'progress', %(progress)s::int)
    FROM renewed
)
SELECT * FROM renewed;

-- name: job_finish_if_leased
-- running -> succeeded: compare-and-set on (running, same token, lease unexpired, deadline
-- ahead, not cancelled). Records the artifact that won (with the store's ETag, NULL for
-- the file backend); a stale worker matches nothing.
WITH done AS (
    UPDATE export_jobs
    SET status = 'succeeded',
        result_ref = %(result_ref)s,
        result_sha256 = %(sha256)s,
        result_bytes = %(bytes)s,
        result_rows = %(rows)s,
        result_etag = %(etag)s,
        lease_expires_at = NULL,
        finished_at = now(),
        updated_at = now()
    WHERE id = %(job_id)s
      AND status = 'running'
      AND lease_token = %(lease_token)s
      AND lease_expires_at > now()
      AND deadline_at > now()
      AND NOT cancel_requested
    RETURNING *
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt, lease_token, detail)
    SELECT id, 'succeeded', 'running', 'succeeded', attempts, lease_token,
           jsonb_build_object('result_ref', result_ref, 'sha256', result_sha256,
                              'bytes', result_bytes, 'rows', result_rows,
                              'etag', result_etag)
    FROM done
)
SELECT * FROM done;

-- name: job_get
SELECT * FROM export_jobs WHERE id = %(job_id)s;

-- name: job_past_deadline
SELECT deadline_at <= now() AS past FROM export_jobs WHERE id = %(job_id)s;

-- name: job_get_for_tenant
SELECT * FROM export_jobs WHERE id = %(job_id)s AND tenant_id = %(tenant_id)s;

-- name: job_items_chunk
-- One chunk of the snapshot, by ordinal (keyset), for streaming renders: at most `limit`
-- notes and at most `max_bytes` of title + content (but always the first note), so memory
-- stays bounded whatever the notes' sizes. `window_rows` is how many notes the ordinal
-- window held before the byte bound: fewer than `limit` means the snapshot ends here.
SELECT ordinal, note_id, title, content, pinned, updated_at, window_rows
FROM (
    SELECT i.*,
           count(*) OVER () AS window_rows,
           row_number() OVER (ORDER BY i.ordinal) AS n,
           sum(octet_length(i.title) + octet_length(i.content)) OVER (ORDER BY i.ordinal)
               AS running_bytes
    FROM (
        SELECT * FROM export_job_items
        WHERE job_id = %(job_id)s AND ordinal > %(after)s
        ORDER BY ordinal
        LIMIT %(limit)s
    ) i
) w
WHERE n = 1 OR running_bytes <= %(max_bytes)s
ORDER BY ordinal;

-- name: job_events
SELECT id, at, kind, from_status, to_status, attempt, lease_token, message_id, detail
FROM export_job_events
WHERE job_id = %(job_id)s
ORDER BY id;

-- name: job_requeue_if_leased
-- running -> queued, due again after `delay_seconds` but never later than `margin_seconds`
-- before the deadline, with a new outbox event available at that time. Used by the lease
-- holder after a transient error (event `retried`, outbox reason `retry`) and by the
-- recovery-scanner once the lease has expired (`expired_only`, event `lease_expired`,
-- outbox reason `recovery`). Refused when no attempt or no time is left, or on a cancel.
WITH requeued AS (
    UPDATE export_jobs
    SET status = 'queued',
        lease_expires_at = NULL,
        next_attempt_at = least(now() + make_interval(secs => %(delay_seconds)s),
                                deadline_at - make_interval(secs => %(margin_seconds)s)),
        error_code = %(error_code)s,
        error_detail = %(error_detail)s,
        recovery_kind = CASE WHEN %(expired_only)s THEN 'lease_expiry' END,
        recovery_started_at = CASE WHEN %(expired_only)s THEN lease_expires_at END,
        updated_at = now()
    WHERE id = %(job_id)s
      AND status = 'running'
      AND lease_token = %(lease_token)s
      AND (NOT %(expired_only)s OR lease_expires_at <= now())
      AND attempts < max_attempts
      AND NOT cancel_requested
      AND deadline_at > now() + make_interval(secs => %(margin_seconds)s)
    RETURNING *
), outbox AS (
    INSERT INTO export_outbox (id, job_id, queue, reason, available_at, trace_context)
    SELECT %(message_id)s, id, queue, %(outbox_reason)s, next_attempt_at, trace_context
    FROM requeued
), history AS (
    INSERT INTO export_job_events
        (job_id, kind, from_status, to_status, attempt, lease_token, message_id, detail)
    SELECT id, %(event_kind)s, 'running', 'queued', attempts, lease_token, %(message_id)s,
           jsonb_build_object('error_code', error_code, 'next_attempt_at', next_attempt_at)
    FROM requeued
)
SELECT * FROM requeued;

-- name: job_fail_if_leased
-- running -> failed + dead letter: a permanent error, or no attempt or time left. By the
-- lease holder, or by the recovery-scanner once the lease has expired (`expired_only`).
WITH failed AS (
    UPDATE export_jobs
    SET status = 'failed',
        error_code = %(error_code)s,
        error_detail = %(error_detail)s,
        lease_expires_at = NULL,
        finished_at = now(),
        updated_at = now()
    WHERE id = %(job_id)s
      AND status = 'running'
      AND lease_token = %(lease_token)s
      AND (NOT %(expired_only)s OR lease_expires_at <= now())
    RETURNING *
), dead AS (
    INSERT INTO export_dead_letters (job_id, tenant_id, reason, detail, attempts)
    SELECT id, tenant_id, error_code, coalesce(error_detail, ''), attempts FROM failed
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt, lease_token, detail)
    SELECT f.id, k.kind, k.from_status, k.to_status, f.attempts, f.lease_token,
           jsonb_build_object('error_code', f.error_code, 'error_detail', f.error_detail)
    FROM failed f
    CROSS JOIN (VALUES (1, 'lease_expired', 'running', 'running'),
                       (2, 'failed', 'running', 'failed'),
                       (3, 'dead_lettered', 'failed', 'failed')) AS k (n, kind, from_status, to_status)
    WHERE k.n > 1 OR %(expired_only)s
    ORDER BY k.n
)
SELECT * FROM failed;

-- name: job_cancel_if_leased
-- running -> cancelled once a requested cancel has stopped the lease holder (or, with
-- `expired_only`, once the lease of a cancelled job has expired).
WITH cancelled AS (
    UPDATE export_jobs
    SET status = 'cancelled', lease_expires_at = NULL, finished_at = now(), updated_at = now()
    WHERE id = %(job_id)s
      AND status = 'running'
      AND lease_token = %(lease_token)s
      AND cancel_requested
      AND (NOT %(expired_only)s OR lease_expires_at <= now())
    RETURNING *
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt, lease_token)
    SELECT c.id, k.kind, 'running', k.to_status, c.attempts, c.lease_token
    FROM cancelled c
    CROSS JOIN (VALUES (1, 'lease_expired', 'running'), (2, 'cancelled', 'cancelled'))
        AS k (n, kind, to_status)
    WHERE k.n > 1 OR %(expired_only)s
    ORDER BY k.n
)
SELECT * FROM cancelled;

-- name: job_request_cancel
-- A tenant asks to cancel: a queued job is cancelled at once (same transaction); a running
-- job is flagged and its worker stops at the next boundary. Terminal jobs match nothing.
WITH target AS (
    SELECT id, status FROM export_jobs
    WHERE id = %(job_id)s AND tenant_id = %(tenant_id)s
    FOR UPDATE
), changed AS (
    UPDATE export_jobs j
    SET cancel_requested = true,
        status = CASE WHEN t.status = 'queued' THEN 'cancelled' ELSE j.status END,
        finished_at = CASE WHEN t.status = 'queued' THEN now() ELSE j.finished_at END,
        updated_at = now()
    FROM target t
    WHERE j.id = t.id AND j.status IN ('queued', 'running') AND NOT j.cancel_requested
    RETURNING j.*, t.status AS previous_status
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt)
    SELECT c.id, k.kind, c.previous_status, k.to_status, c.attempts
    FROM changed c
    CROSS JOIN (VALUES (1, 'cancel_requested', NULL), (2, 'cancelled', 'cancelled'))
        AS k (n, kind, to_status)
    WHERE k.n = 1 OR c.previous_status = 'queued'
    ORDER BY k.n
)
SELECT * FROM changed;

-- name: job_replay
-- A NEW queued job with the failed original's snapshot and `replay_of`; the original job
-- and its dead letter stay as they are (only a `replayed` history event is added).
WITH original AS (
    SELECT * FROM export_jobs WHERE id = %(original_id)s AND status = 'failed'
), job AS (
    INSERT INTO export_jobs (
        id, tenant_id, status, queue, format, payload, note_count, request_hash,
        max_attempts, deadline_at, replay_of, trace_context)
    SELECT %(job_id)s, tenant_id, 'queued', queue, format, payload, note_count, request_hash,
           %(max_attempts)s, now() + make_interval(secs => %(deadline_seconds)s), id,
           %(trace_context)s
    FROM original
    RETURNING *
), items AS (
    INSERT INTO export_job_items (job_id, ordinal, note_id, title, content, pinned, updated_at)
    SELECT job.id, i.ordinal, i.note_id, i.title, i.content, i.pinned, i.updated_at
    FROM job JOIN export_job_items i ON i.job_id = job.replay_of
    RETURNING 1
), outbox AS (
    INSERT INTO export_outbox (id, job_id, queue, reason, trace_context)
    SELECT %(message_id)s, job.id, job.queue, 'replay', job.trace_context FROM job
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, message_id, detail)
    SELECT job.id, 'submitted', NULL, 'queued', %(message_id)s,
           jsonb_build_object('source', 'replay', 'replay_of', job.replay_of)
    FROM job
    UNION ALL
    SELECT job.replay_of, 'replayed', NULL, NULL, NULL,
           jsonb_build_object('replayed_by', job.id)
    FROM job
)
SELECT job.*, (SELECT count(*) FROM items) AS snapshot_count,
       pg_notify('export_outbox', job.queue)::text AS notified
FROM job;

-- name: job_lock_for_replay
-- Lock the job a replay is asked for: concurrent replays of one job queue up here, so the
-- first writes the replay and the others find it (idempotent replay). The unique index
-- export_jobs_one_active_replay is the durable guard behind this lock.
SELECT id, tenant_id, status FROM export_jobs WHERE id = %(job_id)s FOR UPDATE;

-- name: job_latest_replay
-- The newest replay of a job (any status), or nothing.
SELECT * FROM export_jobs
WHERE replay_of = %(job_id)s
ORDER BY created_at DESC, id DESC
LIMIT 1;

-- name: job_list_for_tenant
-- A tenant's jobs, newest first, after a keyset cursor (created_at, id), one status or all.
SELECT * FROM export_jobs
WHERE tenant_id = %(tenant_id)s
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(before_created_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(before_created_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;
