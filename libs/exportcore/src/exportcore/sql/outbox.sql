-- Transactional outbox: events written with the job, relayed to the broker by publishers.
-- An event is owned by one publisher at a time through (claim_token, claimed_until).

-- name: outbox_claim_due
-- Claim a bounded batch of due, unclaimed (or claim-expired) events for one publisher.
WITH due AS (
    SELECT id
    FROM export_outbox
    WHERE sent_at IS NULL
      AND available_at <= now()
      AND (claimed_until IS NULL OR claimed_until < now())
    ORDER BY available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE export_outbox o
SET claim_token = %(claim_token)s,
    claimed_until = now() + make_interval(secs => %(claim_seconds)s),
    publish_attempts = o.publish_attempts + 1
FROM due
WHERE o.id = due.id
RETURNING o.id, o.job_id, o.queue, o.reason, o.publish_attempts, o.trace_context;

-- name: outbox_mark_sent
-- Mark published events sent (only those this publisher still owns), stamp each job's
-- dispatch, and write a `dispatched` history event per message.
WITH sent AS (
    UPDATE export_outbox
    SET sent_at = now(), claim_token = NULL, claimed_until = NULL, last_error = NULL
    WHERE id = ANY(%(ids)s::uuid[]) AND claim_token = %(claim_token)s AND sent_at IS NULL
    RETURNING id, job_id, reason
), jobs AS (
    UPDATE export_jobs j
    SET last_dispatched_at = now(), dispatch_count = j.dispatch_count + 1
    FROM (SELECT job_id, count(*) AS n FROM sent GROUP BY job_id) s
    WHERE j.id = s.job_id
    RETURNING j.id, j.dispatch_count
), history AS (
    INSERT INTO export_job_events (job_id, kind, message_id, detail)
    SELECT sent.job_id, 'dispatched', sent.id,
           jsonb_build_object('reason', sent.reason, 'dispatch_count', jobs.dispatch_count)
    FROM sent JOIN jobs ON jobs.id = sent.job_id
)
SELECT sent.id, sent.job_id FROM sent;

-- name: outbox_release
-- Give claimed events back after a failed publish, due again after a backoff.
UPDATE export_outbox
SET claim_token = NULL,
    claimed_until = NULL,
    available_at = now() + make_interval(secs => %(retry_seconds)s),
    last_error = %(error)s
WHERE id = %(id)s AND claim_token = %(claim_token)s AND sent_at IS NULL
RETURNING id;

-- name: outbox_next_due_in
-- Seconds until the earliest pending event becomes claimable (NULL when none is pending):
-- due, and not owned by a live claim of another publisher. (greatest() ignores NULLs, so
-- the "none pending" case must not go through it.)
SELECT CASE WHEN count(*) = 0 THEN NULL
            ELSE greatest(0, extract(epoch FROM
                     min(greatest(available_at, coalesce(claimed_until, available_at))) - now()))
       END::float8 AS seconds
FROM export_outbox
WHERE sent_at IS NULL;
