-- Transactional outbox: events written with the job, relayed to the broker by publishers.
-- An event is owned by one publisher at a time through (claim_token, claimed_until).

-- fragment: outbox_mark_sent
-- The CTEs `sent`, `r`, `locked`, `jobs` and `history` that mark a publisher's published events sent
-- (`sent_ids`, only those it still owns through `sent_token`), stamp each job's dispatch
-- (last_dispatched_at, dispatch_count: read by the lost-dispatch rule; its jobs locked in
-- id order first, jobs.sql job_lock_requested) and write one
-- `dispatched` history event per message, dated when the dispatch began (`dispatched_at`,
-- the claim's time: before the send, so before any worker's claim of the job).
sent AS (
    UPDATE export_outbox
    SET sent_at = now(), claim_token = NULL, claimed_until = NULL, last_error = NULL
    WHERE id = ANY(%(sent_ids)s::uuid[]) AND claim_token = %(sent_token)s AND sent_at IS NULL
    RETURNING id, job_id, reason
), r AS (
    SELECT job_id FROM sent
), {{jobs.job_lock_requested}}, jobs AS (
    UPDATE export_jobs j
    SET last_dispatched_at = now(), dispatch_count = j.dispatch_count + s.n
    FROM (SELECT job_id, count(*) AS n FROM sent GROUP BY job_id) s
    JOIN locked l ON l.id = s.job_id
    WHERE j.id = s.job_id
    RETURNING j.id, j.dispatch_count
), history AS (
    INSERT INTO export_job_events (job_id, at, kind, message_id, detail)
    SELECT sent.job_id, %(dispatched_at)s::timestamptz, 'dispatched', sent.id,
           jsonb_build_object('reason', sent.reason, 'dispatch_count', jobs.dispatch_count)
    FROM sent JOIN jobs ON jobs.id = sent.job_id
    ORDER BY sent.id
)

-- fragment: outbox_pair_load
-- The load of a (tenant, queue) pair aliased `g` (docs/architecture.md INV-16): joined
-- after it, it gives `c.cap` (the tenant's override, else `bulk_cap` / `fast_cap`) and
-- `f.in_flight`, the pair's jobs IN FLIGHT counted from the rows: running, or queued and
-- dispatched (an event sent or held by a publisher) with no claimable event of its own;
-- a job waiting for a retry's backoff or a redispatch is not in flight. The events of
-- `sent_ids` (being marked sent by the same statement) count as sent. Counted up to the
-- cap only: past it the pair takes nothing anyway. Read by the fair claim below and by
-- the held-back gauge (metrics.sql).
LEFT JOIN tenants t ON t.id = g.tenant_id
CROSS JOIN LATERAL (
    SELECT CASE WHEN g.queue = 'exports.fast' THEN coalesce(t.fast_in_flight, %(fast_cap)s)
                ELSE coalesce(t.bulk_in_flight, %(bulk_cap)s) END AS cap
) c
CROSS JOIN LATERAL (
    SELECT count(*)::int AS in_flight FROM (
        SELECT j.id FROM export_jobs j
        WHERE j.tenant_id = g.tenant_id AND j.queue = g.queue
          AND (j.status = 'running'
               OR (j.status = 'queued' AND j.last_dispatched_at IS NOT NULL))
          AND (j.status = 'running' OR NOT EXISTS (
              SELECT 1 FROM export_outbox p
              WHERE p.job_id = j.id AND p.sent_at IS NULL
                AND (p.claimed_until IS NULL OR p.claimed_until < now())
                AND p.id <> ALL(%(sent_ids)s::uuid[])))
        UNION
        SELECT o.job_id FROM export_outbox o
        JOIN export_jobs j ON j.id = o.job_id
        WHERE o.tenant_id = g.tenant_id AND o.queue = g.queue
          AND o.sent_at IS NULL AND o.claim_token IS NOT NULL
          AND (o.claimed_until >= now() OR o.id = ANY(%(sent_ids)s::uuid[]))
          AND j.status IN ('queued', 'running')
        LIMIT c.cap
    ) busy
) f

-- name: outbox_claim_lock
-- Claims of all publishers are serialised (taken before outbox_mark_sent_and_claim_due, in
-- the same transaction): the claim's statement snapshot then sees every other publisher's
-- committed claims, so two publishers never both fill one tenant's free slot (a cap is a
-- hard bound). Held for one statement; the broker I/O happens after COMMIT.
SELECT pg_advisory_xact_lock(hashtextextended('exports:outbox:claim', 0));

-- name: outbox_mark_sent_and_claim_due
-- One publisher pass in ONE statement: mark the events this publisher sent in its previous
-- pass (`sent_ids`, still owned through `sent_token`) sent, stamp their jobs' dispatch and
-- write their `dispatched` events dated when that dispatch began (`dispatched_at`, the
-- previous claim's time: before the send, so before any worker's claim of the job); then
-- claim a bounded batch of due, unclaimed (or claim-expired) events, FAIRLY. Folding the
-- mark of one pass into the claim of the next saves a commit per pass whenever work keeps
-- coming (a crash before the next pass leaves the claims to expire: the events are sent
-- again and the duplicates refused by the job claim, as before).
-- Fair dispatch (docs/architecture.md INV-16): the claim walks the (tenant, queue) pairs
-- with pending events (`groups`, a skip scan of export_outbox_tenant_pending_idx: one probe
-- per pair), counts each pair's jobs IN FLIGHT from the rows (`load`: outbox_pair_load
-- above) and takes at most cap - in_flight of the pair's due events. The pairs' events are
-- then ranked round robin — every pair's first event, then every pair's second, ... (due
-- time breaks ties) — and the batch is the first `limit` of them, so a pass shares its
-- batch across tenants. An event past its pair's cap is HELD: not claimed, so its
-- publish_attempts is untouched; it is claimed by a later pass once a slot frees (the
-- publisher re-checks while `held` > 0).
-- The claimed batch is what the workers later claim together (job_claim_many).
-- One row per claimed event (`id` NULL when none) with `marked`, `held` (pairs with due
-- events held back by their cap) and `next_due_in` (seconds until the next pending event
-- not due now becomes claimable; NULL: none).
-- Events of `held_queues` are left pending as well (the publisher's broker window: that
-- queue already has enough messages waiting in the broker, so its backlog stays here, where
-- it forms batches); they are not counted in `held`.
WITH RECURSIVE {{outbox_mark_sent}}, groups AS (
    (SELECT o.tenant_id, o.queue FROM export_outbox o
     WHERE o.sent_at IS NULL
     ORDER BY o.tenant_id, o.queue
     LIMIT 1)
    UNION ALL
    SELECT nxt.tenant_id, nxt.queue
    FROM groups g
    CROSS JOIN LATERAL (
        SELECT o.tenant_id, o.queue FROM export_outbox o
        WHERE o.sent_at IS NULL AND (o.tenant_id, o.queue) > (g.tenant_id, g.queue)
        ORDER BY o.tenant_id, o.queue
        LIMIT 1
    ) nxt
), load AS (
    SELECT g.tenant_id, g.queue, c.cap, f.in_flight
    FROM (SELECT * FROM groups WHERE queue <> ALL(%(held_queues)s::text[])) g
    {{outbox_pair_load}}
), ranked AS (
    SELECT e.id, e.available_at, e.rn, l.cap - l.in_flight AS slots
    FROM load l
    CROSS JOIN LATERAL (
        SELECT o.id, o.available_at, row_number() OVER (ORDER BY o.available_at, o.id) AS rn
        FROM export_outbox o
        WHERE o.tenant_id = l.tenant_id AND o.queue = l.queue
          AND o.sent_at IS NULL
          AND o.available_at <= now()
          AND (o.claimed_until IS NULL OR o.claimed_until < now())
          AND o.id <> ALL(%(sent_ids)s::uuid[])
        ORDER BY o.available_at, o.id
        -- one more than the pair may take: that one only tells that the pair holds back
        LIMIT least(l.cap - l.in_flight, %(limit)s) + 1
    ) e
), due AS (
    SELECT o.id, r.rn
    FROM export_outbox o
    JOIN (SELECT id, rn FROM ranked WHERE rn <= slots ORDER BY rn, available_at, id
          LIMIT %(limit)s) r ON r.id = o.id
    WHERE o.sent_at IS NULL AND (o.claimed_until IS NULL OR o.claimed_until < now())
    FOR UPDATE OF o SKIP LOCKED
), claimed AS (
    UPDATE export_outbox o
    SET claim_token = %(claim_token)s,
        claimed_until = now() + make_interval(secs => %(claim_seconds)s),
        publish_attempts = o.publish_attempts + 1
    FROM due
    WHERE o.id = due.id
    RETURNING o.id, o.job_id, o.tenant_id, o.queue, o.reason, o.publish_attempts,
              o.trace_context, o.available_at, due.rn
), pending AS (
    -- due events not claimed now are held back (the publisher re-checks) or beyond a full
    -- batch (it comes back at once): only events due LATER set the wait
    SELECT least(
        (SELECT min(available_at) FROM export_outbox
         WHERE sent_at IS NULL AND available_at > now()),
        (SELECT min(claimed_until) FROM export_outbox
         WHERE sent_at IS NULL AND claim_token IS NOT NULL AND claimed_until >= now()
           AND id <> ALL(%(sent_ids)s::uuid[]))) AS next_at
)
SELECT m.marked, h.held,
       CASE WHEN p.next_at IS NULL THEN NULL  -- greatest() would turn NULL into 0
            ELSE greatest(0, extract(epoch FROM p.next_at - now())) END::float8
           AS next_due_in,
       c.id, c.job_id, c.tenant_id, c.queue, c.reason, c.publish_attempts, c.trace_context,
       now() AS claimed_at
FROM (SELECT count(*)::int AS marked FROM sent) m
CROSS JOIN (SELECT count(*)::int AS held FROM ranked WHERE rn > slots) h
CROSS JOIN pending p
LEFT JOIN claimed c ON true
ORDER BY c.rn, c.available_at, c.id;

-- name: outbox_mark_sent_many
-- The same mark on its own (outbox_mark_sent above), for a publisher stopping with sent,
-- unmarked events (`sent_ids`, owned through `sent_token`). Returns how many were marked
-- and, from the same snapshot, the seconds until the next pending event (not one of these)
-- becomes claimable, NULL when none is pending: the publisher's wait, without a second
-- query.
WITH {{outbox_mark_sent}}, pending AS (
    SELECT min(greatest(available_at, coalesce(claimed_until, available_at))) AS next_at
    FROM export_outbox
    WHERE sent_at IS NULL AND id <> ALL(%(sent_ids)s::uuid[])
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
