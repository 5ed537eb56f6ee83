-- Transactional outbox: events written with the job, relayed to the broker by publishers.
-- An event is owned by one publisher at a time through (claim_token, claimed_until).

-- name: outbox_mark_sent_and_claim_due
-- One publisher pass in ONE statement: mark the events this publisher sent in its previous
-- pass (`sent_ids`, still owned through `sent_token`) sent, stamp their jobs' dispatch and
-- write their `dispatched` events dated when that dispatch began (`dispatched_at`, the
-- previous claim's time: before the send, so before any worker's claim of the job); then
-- claim a bounded batch of due, unclaimed (or claim-expired) events. Folding the mark of
-- one pass into the claim of the next saves a commit per pass whenever work keeps coming
-- (a crash before the next pass leaves the claims to expire: the events are sent again and
-- the duplicates refused by the job claim, as before).
-- The claimed batch is what the workers later claim together (job_claim_many), so its
-- ORDER BY is where dispatch order is decided (FIFO by due time today; a per-tenant round
-- robin would rank here). One row per claimed event (`id` NULL when none) with `marked` and
-- `next_due_in` (seconds until the next other pending event is claimable; NULL: none).
-- Events of `held_queues` are left pending (the publisher's broker window: that queue already
-- has enough messages waiting in the broker, so its backlog stays here, where it forms
-- batches) and are not counted in `next_due_in`.
WITH sent AS (
    UPDATE export_outbox
    SET sent_at = now(), claim_token = NULL, claimed_until = NULL, last_error = NULL
    WHERE id = ANY(%(sent_ids)s::uuid[]) AND claim_token = %(sent_token)s AND sent_at IS NULL
    RETURNING id, job_id, reason
), jobs AS (
    UPDATE export_jobs j
    SET last_dispatched_at = now(), dispatch_count = j.dispatch_count + s.n
    FROM (SELECT job_id, count(*) AS n FROM sent GROUP BY job_id) s
    WHERE j.id = s.job_id
    RETURNING j.id, j.dispatch_count
), history AS (
    INSERT INTO export_job_events (job_id, at, kind, message_id, detail)
    SELECT sent.job_id, %(dispatched_at)s::timestamptz, 'dispatched', sent.id,
           jsonb_build_object('reason', sent.reason, 'dispatch_count', jobs.dispatch_count)
    FROM sent JOIN jobs ON jobs.id = sent.job_id
    ORDER BY sent.id
), due AS (
    SELECT id
    FROM export_outbox
    WHERE sent_at IS NULL
      AND available_at <= now()
      AND (claimed_until IS NULL OR claimed_until < now())
      AND id <> ALL(%(sent_ids)s::uuid[])
      AND queue <> ALL(%(held_queues)s::text[])
    ORDER BY available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE export_outbox o
    SET claim_token = %(claim_token)s,
        claimed_until = now() + make_interval(secs => %(claim_seconds)s),
        publish_attempts = o.publish_attempts + 1
    FROM due
    WHERE o.id = due.id
    RETURNING o.id, o.job_id, o.queue, o.reason, o.publish_attempts, o.trace_context,
              o.available_at
), pending AS (
    SELECT min(greatest(available_at, coalesce(claimed_until, available_at))) AS next_at
    FROM export_outbox
    WHERE sent_at IS NULL
      AND id <> ALL(%(sent_ids)s::uuid[])
      AND queue <> ALL(%(held_queues)s::text[])
      AND id NOT IN (SELECT id FROM due)
)
SELECT m.marked,
       CASE WHEN p.next_at IS NULL THEN NULL  -- greatest() would turn NULL into 0
            ELSE greatest(0, extract(epoch FROM p.next_at - now())) END::float8
           AS next_due_in,
       c.id, c.job_id, c.queue, c.reason, c.publish_attempts, c.trace_context,
       now() AS claimed_at
FROM (SELECT count(*)::int AS marked FROM sent) m
CROSS JOIN pending p
LEFT JOIN claimed c ON true
ORDER BY c.available_at, c.id;

-- name: outbox_mark_sent_many
-- The same mark on its own (a publisher stopping with sent, unmarked events): mark the
-- published events sent (only those this
-- publisher still owns), stamp each job's dispatch (a heap-only update: no indexed column
-- changes), and write one `dispatched` history event per message, dated when the dispatch
-- began (`dispatched_at`, the claim's time: before the send, so before any claim of the
-- job by a worker). Returns how many were marked and, from the same snapshot, the seconds
-- until the next pending event (not one of these) becomes claimable, NULL when none is
-- pending: the publisher's wait, without a second query.
WITH sent AS (
    UPDATE export_outbox
    SET sent_at = now(), claim_token = NULL, claimed_until = NULL, last_error = NULL
    WHERE id = ANY(%(ids)s::uuid[]) AND claim_token = %(claim_token)s AND sent_at IS NULL
    RETURNING id, job_id, reason
), jobs AS (
    UPDATE export_jobs j
    SET last_dispatched_at = now(), dispatch_count = j.dispatch_count + s.n
    FROM (SELECT job_id, count(*) AS n FROM sent GROUP BY job_id) s
    WHERE j.id = s.job_id
    RETURNING j.id, j.dispatch_count
), history AS (
    INSERT INTO export_job_events (job_id, at, kind, message_id, detail)
    SELECT sent.job_id, %(dispatched_at)s::timestamptz, 'dispatched', sent.id,
           jsonb_build_object('reason', sent.reason, 'dispatch_count', jobs.dispatch_count)
    FROM sent JOIN jobs ON jobs.id = sent.job_id
    ORDER BY sent.id
), pending AS (
    SELECT min(greatest(available_at, coalesce(claimed_until, available_at))) AS next_at
    FROM export_outbox
    WHERE sent_at IS NULL AND id <> ALL(%(ids)s::uuid[])
)
SELECT (SELECT count(*) FROM sent)::int AS marked,
       CASE WHEN pending.next_at IS NULL THEN NULL  -- greatest() would turn NULL into 0
            ELSE greatest(0, extract(epoch FROM pending.next_at - now())) END::float8
           AS next_due_in
FROM pending;

-- name: outbox_release_many
-- Give claimed events back after a failed publish, each due again after its backoff.
UPDATE export_outbox o
SET claim_token = NULL,
    claimed_until = NULL,
    available_at = now() + make_interval(secs => r.retry_seconds),
    last_error = %(error)s
FROM unnest(%(ids)s::uuid[], %(retry_seconds)s::float8[]) AS r (id, retry_seconds)
WHERE o.id = r.id AND o.claim_token = %(claim_token)s AND o.sent_at IS NULL
RETURNING o.id;

-- name: outbox_delete_sent_before
-- Retention (the recovery-scanner): events sent more than `retention_seconds` ago, in a
-- bounded batch locked with FOR UPDATE SKIP LOCKED.
DELETE FROM export_outbox
WHERE id IN (
    SELECT id FROM export_outbox
    WHERE sent_at < now() - make_interval(secs => %(retention_seconds)s)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
RETURNING id;
