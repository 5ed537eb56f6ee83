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
), history AS (
    INSERT INTO export_job_events (job_id, kind, to_status, message_id, detail)
    SELECT job.id, 'submitted', 'queued', %(message_id)s, %(event_detail)s FROM job
)
SELECT job.*, pg_notify('export_outbox', job.queue)::text AS notified FROM job;

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
SELECT * FROM claimed;

-- name: job_claim_refusal
-- Why a claim matched nothing (read only, on the refusal path).
SELECT id, status, attempts, max_attempts, cancel_requested, lease_expires_at,
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
-- ahead, not cancelled). Records the artifact that won; a stale worker matches nothing.
WITH done AS (
    UPDATE export_jobs
    SET status = 'succeeded',
        result_ref = %(result_ref)s,
        result_sha256 = %(sha256)s,
        result_bytes = %(bytes)s,
        result_rows = %(rows)s,
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
                              'bytes', result_bytes, 'rows', result_rows)
    FROM done
)
SELECT * FROM done;

-- name: job_get
SELECT * FROM export_jobs WHERE id = %(job_id)s;

-- name: job_get_for_tenant
SELECT * FROM export_jobs WHERE id = %(job_id)s AND tenant_id = %(tenant_id)s;

-- name: job_items_chunk
-- One chunk of the snapshot, by ordinal (keyset), for streaming renders.
SELECT ordinal, note_id, title, content, pinned, updated_at
FROM export_job_items
WHERE job_id = %(job_id)s AND ordinal > %(after)s
ORDER BY ordinal
LIMIT %(limit)s;

-- name: job_events
SELECT id, at, kind, from_status, to_status, attempt, lease_token, message_id, detail
FROM export_job_events
WHERE job_id = %(job_id)s
ORDER BY id;

-- name: job_fail_if_leased
-- running -> failed by the lease holder (a permanent error, or no retry budget left).
WITH failed AS (
    UPDATE export_jobs
    SET status = 'failed',
        error_code = %(error_code)s,
        error_detail = %(error_detail)s,
        lease_expires_at = NULL,
        finished_at = now(),
        updated_at = now()
    WHERE id = %(job_id)s AND status = 'running' AND lease_token = %(lease_token)s
    RETURNING *
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt, lease_token, detail)
    SELECT id, 'failed', 'running', 'failed', attempts, lease_token,
           jsonb_build_object('error_code', error_code, 'error_detail', error_detail)
    FROM failed
)
SELECT * FROM failed;
