-- The recovery-scanner's rules and hygiene. Every rule works on a bounded batch locked with
-- FOR UPDATE SKIP LOCKED, so several scanners never act on the same job, and every change
-- writes its history event in the same statement.

-- name: scan_cancel_queued
-- queued + cancel requested -> cancelled.
WITH doomed AS (
    SELECT id FROM export_jobs
    WHERE status = 'queued' AND cancel_requested
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), cancelled AS (
    UPDATE export_jobs j
    SET status = 'cancelled', finished_at = now(), updated_at = now()
    FROM doomed d
    WHERE j.id = d.id AND j.status = 'queued' AND j.cancel_requested
    RETURNING j.id, j.attempts, j.queue, j.created_at, j.finished_at
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt)
    SELECT id, 'cancelled', 'queued', 'cancelled', attempts FROM cancelled
)
SELECT id, queue, extract(epoch FROM finished_at - created_at)::float8 AS age FROM cancelled;

-- name: scan_fail_queued
-- queued past the deadline or out of attempts -> failed + dead letter.
WITH doomed AS (
    SELECT id FROM export_jobs
    WHERE status = 'queued' AND (deadline_at <= now() OR attempts >= max_attempts)
    ORDER BY deadline_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), failed AS (
    UPDATE export_jobs j
    SET status = 'failed',
        error_code = CASE WHEN j.deadline_at <= now() THEN 'deadline_exceeded'
                          ELSE 'attempts_exhausted' END,
        error_detail = CASE WHEN j.deadline_at <= now() THEN 'the deadline passed while queued'
                            ELSE 'no attempts left' END,
        finished_at = now(),
        updated_at = now()
    FROM doomed d
    WHERE j.id = d.id AND j.status = 'queued'
      AND (j.deadline_at <= now() OR j.attempts >= j.max_attempts)
    RETURNING j.*
), dead AS (
    INSERT INTO export_dead_letters (job_id, tenant_id, reason, detail, attempts)
    SELECT id, tenant_id, error_code, error_detail, attempts FROM failed
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt, detail)
    SELECT f.id, k.kind, k.from_status, 'failed', f.attempts,
           jsonb_build_object('error_code', f.error_code)
    FROM failed f
    CROSS JOIN (VALUES (1, 'failed', 'queued'), (2, 'dead_lettered', 'failed'))
        AS k (n, kind, from_status)
    ORDER BY k.n
)
SELECT id, error_code, queue, extract(epoch FROM finished_at - created_at)::float8 AS age
FROM failed;

-- name: scan_redispatch_lost
-- queued, due, no pending outbox event, and last dispatched (or created) longer ago than the
-- dispatch threshold -> a new outbox event; attempts unchanged. The threshold doubles with
-- each dispatch of the job (capped by max_factor), so a job that waits behind a long queue
-- is not sent again every threshold. Stamping last_dispatched_at in the same UPDATE makes a
-- concurrent scanner's re-check of the row fail, so one loss gives one new event.
WITH lost AS (
    UPDATE export_jobs j
    SET last_dispatched_at = now(),
        recovery_kind = coalesce(j.recovery_kind, 'lost_dispatch'),
        recovery_started_at = coalesce(j.recovery_started_at, j.last_dispatched_at, j.created_at)
    WHERE j.id IN (
        SELECT c.id FROM export_jobs c
        WHERE c.status = 'queued'
          AND c.next_attempt_at <= now()
          AND NOT c.cancel_requested
          AND c.deadline_at > now()
          AND coalesce(c.last_dispatched_at, c.created_at)
              < now() - make_interval(secs => %(threshold_seconds)s
                    * least(power(2, greatest(c.dispatch_count - 1, 0)), %(max_factor)s))
          AND NOT EXISTS (
              SELECT 1 FROM export_outbox o WHERE o.job_id = c.id AND o.sent_at IS NULL)
        ORDER BY c.next_attempt_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED)
      AND j.status = 'queued'
      AND coalesce(j.last_dispatched_at, j.created_at)
          < now() - make_interval(secs => %(threshold_seconds)s
                * least(power(2, greatest(j.dispatch_count - 1, 0)), %(max_factor)s))
    RETURNING j.id, j.tenant_id, j.queue, j.trace_context, j.attempts, j.dispatch_count
), outbox AS (
    INSERT INTO export_outbox (id, job_id, tenant_id, queue, reason, trace_context)
    SELECT gen_random_uuid(), id, tenant_id, queue, 'redispatch', trace_context FROM lost
    RETURNING id, job_id
), history AS (
    INSERT INTO export_job_events (job_id, kind, attempt, message_id, detail)
    SELECT l.id, 'redispatched', l.attempts, o.id,
           jsonb_build_object('dispatch_count', l.dispatch_count)
    FROM lost l JOIN outbox o ON o.job_id = l.id
)
SELECT o.job_id, o.id AS message_id, l.tenant_id, l.queue, l.attempts, l.trace_context,
       pg_notify('export_outbox', '')::text AS notified
FROM outbox o JOIN lost l ON l.id = o.job_id;

-- name: prune_terminal_jobs
-- Terminal jobs finished before the retention cutoff (cascades to snapshot, outbox,
-- history and dead letter). Returns their artifacts, to delete after commit.
WITH old AS (
    SELECT id FROM export_jobs
    WHERE status IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(retention_days)s * 86400)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM export_jobs j USING old WHERE j.id = old.id
RETURNING j.id, j.result_ref;

-- name: prune_sent_outbox
DELETE FROM export_outbox
WHERE id IN (
    SELECT id FROM export_outbox
    WHERE sent_at < now() - make_interval(secs => %(retention_seconds)s)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: artifact_owners
-- What the jobs of some artifact keys look like now (orphan cleanup).
SELECT id, status, result_ref, lease_token FROM export_jobs WHERE id = ANY(%(job_ids)s::uuid[]);
