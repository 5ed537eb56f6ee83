-- Transactional outbox: events written with the job, relayed to the broker by publishers.
-- An event is owned by one publisher at a time through (claim_token, claimed_until).

-- The publisher's mark (outbox_mark_sent_and_claim_due and outbox_mark_sent_many, the
-- CTEs `sent` to `history`, written the same in both; tests/unit/test_sql_layout.py checks
-- that the copies stay identical): it marks a publisher's published events sent
-- (`sent_ids`, each only while the publisher still owns it through its claim token
-- `sent_tokens`, and only if no worker's claim marked it first: outbox_mark_delivered),
-- stamps each job's dispatch (last_dispatched_at, dispatch_count: read by the lost-dispatch
-- rule and the in-flight count; its jobs locked in id order first, as jobs.sql's batch
-- statements lock them) and writes one `dispatched` history event per message, dated when
-- the dispatch began (`dispatched_ats`, each event's claim time: before the send, so before
-- any worker's claim of the job). A publisher marks only what no claim marked within
-- its mark delay (PublisherConfig.mark_delay: a message still waiting in the broker).

-- name: outbox_claim_lock
-- Claims of all publishers are serialised (taken before outbox_mark_sent_and_claim_due, in
-- the same transaction): the claim's statement snapshot then sees every other publisher's
-- committed claims, so two publishers never both fill one tenant's free slot (a cap is a
-- hard bound). Held for one statement; the broker I/O happens after COMMIT.
SELECT pg_advisory_xact_lock(hashtextextended('exports:outbox:claim', 0));

-- name: outbox_mark_sent_and_claim_due
-- One claim of due events in ONE statement, made by a publisher's pass and by a worker's
-- claim (the events it takes beside its message's job: exportcore.claims). First it marks
-- the events a publisher sent in its earlier passes and no worker marked yet (`sent_ids`,
-- the publisher's mark: the file header); then it claims a bounded batch of due, unclaimed (or
-- claim-expired) events, FAIRLY, for `claim_token`. Folding the mark into the claim saves a
-- commit whenever work keeps coming (a crash before it leaves the claims to expire: the
-- events are sent again and the duplicates refused by the job claim).
-- Fair dispatch (docs/architecture.md INV-16): the claim walks the (tenant, queue) pairs
-- with pending events (`groups`, a skip scan of export_outbox_tenant_pending_idx: one probe
-- per pair), counts each pair's jobs IN FLIGHT from the rows (`load`: the function
-- exports_pair_load of migration 0020: the pair's cap, the tenant's override else
-- `bulk_cap` / `fast_cap`, and its jobs in flight up to it, the events of `sent_ids`
-- counting as sent) and takes at most cap - in_flight of the pair's due events. The pairs'
-- events are then ranked round robin — every pair's first event, then every pair's second, ... (due
-- time breaks ties) — and the batch is the first `limit` of them (of `exports.fast` at most
-- `fast_limit`, NULL: `limit`), so a claim shares its batch across tenants. An event past
-- its pair's cap is HELD: not claimed, so its publish_attempts is untouched; it is claimed
-- by a later pass once a slot frees (the publisher re-checks while `held` > 0).
-- An event whose job has already ended (cancelled while queued, failed past its deadline,
-- finished through another message) is never sent: the claim deletes it (`dropped`)
-- instead, in the same guarded way (still pending, not owned by a live claim).
-- Events of `held_queues` are left alone (a worker's claim takes only its own queue's), and
-- so are those of a pair an operator paused (a row of dispatch_pauses for its queue, with
-- its tenant or NULL: exportcore.pauses): they wait, unclaimed and not counted as held, until
-- the pause is lifted. The pauses are read once per statement (an anti-join on a table that
-- is empty unless someone paused: nearly free in the common case).
-- One row per claimed event (`id` NULL when none) with `marked`, `held` (pairs with due
-- events held back by their cap), `fast_left` (due `exports.fast` events within their caps
-- that `fast_limit` left pending, of those the claim looked at: > 0 tells that some wait),
-- `dropped` and `next_due_in` (seconds until the next
-- pending event not due now becomes claimable, 0 after a drop; NULL: none).
WITH RECURSIVE sent AS (
    UPDATE export_outbox o
    SET sent_at = now(), claim_token = NULL, claimed_until = NULL, last_error = NULL
    FROM unnest(%(sent_ids)s::uuid[], %(sent_tokens)s::uuid[], %(dispatched_ats)s::timestamptz[])
        AS m (id, token, dispatched_at)
    WHERE o.id = m.id AND o.claim_token = m.token AND o.sent_at IS NULL
    RETURNING o.id, o.job_id, o.reason, m.dispatched_at
), r AS (
    SELECT job_id FROM sent
), locked AS (
    -- the jobs locked in id order, as every batch statement locks them (jobs.sql header)
    SELECT j.id FROM export_jobs j
    WHERE j.id IN (SELECT r.job_id FROM r)
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
), jobs AS (
    UPDATE export_jobs j
    SET last_dispatched_at = now(), dispatch_count = j.dispatch_count + s.n
    FROM (SELECT job_id, count(*) AS n FROM sent GROUP BY job_id) s
    JOIN locked l ON l.id = s.job_id
    WHERE j.id = s.job_id
    RETURNING j.id, j.dispatch_count
), history AS (
    INSERT INTO export_job_events (job_id, at, kind, message_id, detail)
    SELECT sent.job_id, sent.dispatched_at, 'dispatched', sent.id,
           jsonb_build_object('reason', sent.reason, 'dispatch_count', jobs.dispatch_count)
    FROM sent JOIN jobs ON jobs.id = sent.job_id
    ORDER BY sent.id
), groups AS (
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
    SELECT g.tenant_id, g.queue, l.cap, l.in_flight,
           CASE WHEN g.queue = 'exports.fast' THEN coalesce(%(fast_limit)s, %(limit)s)
                ELSE %(limit)s END AS queue_limit
    FROM (SELECT * FROM groups WHERE queue <> ALL(%(held_queues)s::text[])) g
    LEFT JOIN tenants t ON t.id = g.tenant_id
    CROSS JOIN LATERAL exports_pair_load(g.tenant_id, g.queue, t.fast_in_flight, t.bulk_in_flight,
                                         %(fast_cap)s, %(bulk_cap)s, %(sent_ids)s::uuid[]) l
    -- an operator's pause of the queue or of this tenant on it (dispatch_pauses.sql): its
    -- events stay pending, neither claimed nor counted as held
    WHERE NOT EXISTS (SELECT 1 FROM dispatch_pauses p
                      WHERE p.queue = g.queue
                        AND (p.tenant_id IS NULL OR p.tenant_id = g.tenant_id))
), candidates AS (
    -- the pair's first due events, one more than it may take (that one only tells that the
    -- pair holds back), each with whether its job is still live
    SELECT l.tenant_id, l.queue, l.queue_limit, l.cap - l.in_flight AS slots,
           e.id, e.available_at, e.live
    FROM load l
    CROSS JOIN LATERAL (
        SELECT o.id, o.available_at, j.status IN ('queued', 'running') AS live
        FROM export_outbox o
        JOIN export_jobs j ON j.id = o.job_id
        WHERE o.tenant_id = l.tenant_id AND o.queue = l.queue
          AND o.sent_at IS NULL
          AND o.available_at <= now()
          AND (o.claimed_until IS NULL OR o.claimed_until < now())
          AND o.id <> ALL(%(sent_ids)s::uuid[])
        ORDER BY o.available_at, o.id
        LIMIT least(l.cap - l.in_flight, l.queue_limit) + 1
    ) e
), ranked AS (
    SELECT c.id, c.available_at, c.queue, c.queue_limit, c.slots,
           row_number() OVER (PARTITION BY c.tenant_id, c.queue ORDER BY c.available_at, c.id)
               AS rn
    FROM candidates c
    WHERE c.live
), picked AS (
    SELECT r.id, r.rn, r.available_at, r.queue, r.queue_limit,
           row_number() OVER (PARTITION BY r.queue ORDER BY r.rn, r.available_at, r.id) AS qn
    FROM ranked r
    WHERE r.rn <= r.slots
), due AS (
    SELECT o.id, p.rn
    FROM export_outbox o
    JOIN (SELECT id, rn FROM picked WHERE qn <= queue_limit ORDER BY rn, available_at, id
          LIMIT %(limit)s) p ON p.id = o.id
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
), dropped AS (
    DELETE FROM export_outbox o
    USING candidates c
    WHERE o.id = c.id AND NOT c.live
      AND o.sent_at IS NULL AND (o.claimed_until IS NULL OR o.claimed_until < now())
    RETURNING o.id
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
SELECT m.marked, h.held, fl.fast_left, d.dropped,
       CASE WHEN d.dropped > 0 THEN 0
            WHEN p.next_at IS NULL THEN NULL  -- greatest() would turn NULL into 0
            ELSE greatest(0, extract(epoch FROM p.next_at - now())) END::float8
           AS next_due_in,
       c.id, c.job_id, c.tenant_id, c.queue, c.reason, c.publish_attempts, c.trace_context,
       now() AS claimed_at
FROM (SELECT count(*)::int AS marked FROM sent) m
CROSS JOIN (SELECT count(*)::int AS held FROM ranked WHERE rn > slots) h
CROSS JOIN (SELECT count(*)::int AS fast_left FROM picked
            WHERE queue = 'exports.fast' AND qn > queue_limit) fl
CROSS JOIN (SELECT count(*)::int AS dropped FROM dropped) d
CROSS JOIN pending p
LEFT JOIN claimed c ON true
ORDER BY c.rn, c.available_at, c.id;

-- name: outbox_mark_delivered
-- A worker's claim marks the events it delivers sent (exportcore.claims, in the claim's
-- transaction, after job_claim_many locked them): the events of the message it received
-- (`message_ids`: the publisher that sent it then has nothing to mark) and the due events
-- it took with its own claim (`take_token`). Only still unsent events change. It also tells
-- the publishers that the message `carrier` reached a worker (NOTIFY `export_outbox` with
-- `claimed:<carrier>`): a publisher that keeps small exports in the outbox while enough of
-- its messages are on their way to the workers sends its next one then.
WITH delivered AS (
    UPDATE export_outbox
    SET sent_at = now(), claim_token = NULL, claimed_until = NULL, last_error = NULL
    WHERE (id = ANY(%(message_ids)s::uuid[]) OR claim_token = %(take_token)s)
      AND sent_at IS NULL
    RETURNING id
)
SELECT (SELECT count(*) FROM delivered)::int AS delivered,
       CASE WHEN %(carrier)s::uuid IS NOT NULL
            THEN pg_notify('export_outbox', 'claimed:' || %(carrier)s::text)::text END
           AS notified;

-- name: outbox_mark_sent_many
-- The same mark on its own (the publisher's mark: the file header), for a publisher
-- stopping with sent, unmarked events (`sent_ids`, each owned through its `sent_tokens`).
-- Returns how many were marked and, from the same snapshot, the seconds until the next
-- pending event (not one of these) becomes claimable, NULL when none is pending: the
-- publisher's wait, without a second query.
WITH sent AS (
    UPDATE export_outbox o
    SET sent_at = now(), claim_token = NULL, claimed_until = NULL, last_error = NULL
    FROM unnest(%(sent_ids)s::uuid[], %(sent_tokens)s::uuid[], %(dispatched_ats)s::timestamptz[])
        AS m (id, token, dispatched_at)
    WHERE o.id = m.id AND o.claim_token = m.token AND o.sent_at IS NULL
    RETURNING o.id, o.job_id, o.reason, m.dispatched_at
), r AS (
    SELECT job_id FROM sent
), locked AS (
    -- the jobs locked in id order, as every batch statement locks them (jobs.sql header)
    SELECT j.id FROM export_jobs j
    WHERE j.id IN (SELECT r.job_id FROM r)
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
), jobs AS (
    UPDATE export_jobs j
    SET last_dispatched_at = now(), dispatch_count = j.dispatch_count + s.n
    FROM (SELECT job_id, count(*) AS n FROM sent GROUP BY job_id) s
    JOIN locked l ON l.id = s.job_id
    WHERE j.id = s.job_id
    RETURNING j.id, j.dispatch_count
), history AS (
    INSERT INTO export_job_events (job_id, at, kind, message_id, detail)
    SELECT sent.job_id, sent.dispatched_at, 'dispatched', sent.id,
           jsonb_build_object('reason', sent.reason, 'dispatch_count', jobs.dispatch_count)
    FROM sent JOIN jobs ON jobs.id = sent.job_id
    ORDER BY sent.id
), pending AS (
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
