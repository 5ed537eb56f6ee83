-- Webhook messages: the outbox of events for endpoints (written by the triggers of
-- migration 0010 in the transaction of the state change) and their delivery attempts.
-- A message is owned by one delivery process at a time through (claim_token, claimed_until).

-- name: webhook_message_insert
-- A message written by the service itself (the test event), due at once; wakes the senders.
WITH msg AS (
    INSERT INTO webhook_messages (id, endpoint_id, tenant_id, event_type, subject_id, occurred_at, data)
    VALUES (%(message_id)s, %(endpoint_id)s, %(tenant_id)s, %(event_type)s, %(subject_id)s, now(),
            %(data)s)
    RETURNING *
)
SELECT msg.*, pg_notify('webhook_messages', '')::text AS notified FROM msg;

-- name: webhook_message_claim_lock
-- Claims of all delivery processes are serialised (taken before webhook_message_claim_due,
-- in the same transaction): the claim's snapshot then sees every other process's committed
-- claims, so two processes never both fill one tenant's free share of the senders. Held for
-- one statement and the commit; the HTTP happens after COMMIT.
SELECT pg_advisory_xact_lock(hashtextextended('exports:webhooks:claim', 0));

-- name: webhook_message_claim_due
-- Claim due messages for one delivery process, within each endpoint's concurrency bound
-- and each tenant's share of the senders: endpoints that are enabled, whose circuit is
-- closed (or whose open circuit has waited its pause: then one probe at a time), locked so
-- that two processes never count one endpoint's free slots at once; per endpoint at most
-- `per_endpoint` and per tenant at most `per_tenant` messages claimed over all processes
-- (claimed, unexpired messages count as in flight: a tenant's are found through its
-- endpoints, at most WEBHOOK_MAX_ENDPOINTS). The batch is shared round robin across
-- tenants (every tenant's first message, then every tenant's second, ...), so one tenant's
-- backlog never fills a batch while another tenant's message waits. Returns each message
-- with what its attempt needs: the URL and the valid signing secrets (encrypted).
WITH candidates AS (
    SELECT e.id, e.tenant_id, e.consecutive_failures
    FROM webhook_endpoints e
    WHERE e.enabled
      AND (e.circuit_open_until IS NULL OR e.circuit_open_until <= now())
      -- only endpoints whose valid secrets this process can decrypt (key_ids: its
      -- WEBHOOK_SECRET_KEYS): the others' messages wait, unclaimed and unspent, for a
      -- process that holds the key (a rollout that adds a key reaches every process)
      AND e.secret_key_id = ANY(%(key_ids)s::text[])
      AND (e.previous_secret_key_id IS NULL OR e.previous_secret_expires_at <= now()
           OR e.previous_secret_key_id = ANY(%(key_ids)s::text[]))
      AND EXISTS (
          SELECT 1 FROM webhook_messages m
          WHERE m.endpoint_id = e.id AND m.status = 'pending' AND m.next_attempt_at <= now()
            AND (m.claimed_until IS NULL OR m.claimed_until < now()))
    LIMIT %(endpoints)s
    FOR UPDATE OF e SKIP LOCKED
), tenant_slots AS (
    SELECT t.tenant_id,
           %(per_tenant)s
           - (SELECT count(*) FROM webhook_endpoints te
              JOIN webhook_messages m ON m.endpoint_id = te.id
              WHERE te.tenant_id = t.tenant_id AND m.status = 'pending'
                AND m.claim_token IS NOT NULL AND m.claimed_until >= now())
             AS free
    FROM (SELECT DISTINCT c.tenant_id FROM candidates c) t
), slots AS (
    SELECT c.id, c.tenant_id,
           CASE WHEN c.consecutive_failures >= %(threshold)s THEN 1 ELSE %(per_endpoint)s END
           - (SELECT count(*) FROM webhook_messages m
              WHERE m.endpoint_id = c.id AND m.status = 'pending'
                AND m.claim_token IS NOT NULL AND m.claimed_until >= now())
             AS free
    FROM candidates c
), picked AS (
    SELECT d.id, s.tenant_id, d.next_attempt_at
    FROM slots s
    JOIN tenant_slots t ON t.tenant_id = s.tenant_id AND t.free > 0
    CROSS JOIN LATERAL (
        SELECT m.id, m.next_attempt_at FROM webhook_messages m
        WHERE m.endpoint_id = s.id AND m.status = 'pending' AND m.next_attempt_at <= now()
          AND (m.claimed_until IS NULL OR m.claimed_until < now())
        ORDER BY m.next_attempt_at
        LIMIT greatest(least(s.free, t.free), 0)
        FOR UPDATE OF m SKIP LOCKED
    ) d
), ranked AS (
    SELECT p.id, p.tenant_id, p.next_attempt_at,
           row_number() OVER (PARTITION BY p.tenant_id ORDER BY p.next_attempt_at, p.id) AS n
    FROM picked p
), due AS (
    SELECT r.id
    FROM ranked r
    JOIN tenant_slots t ON t.tenant_id = r.tenant_id
    WHERE r.n <= t.free
    ORDER BY r.n, r.next_attempt_at
    LIMIT %(limit)s
), claimed AS (
    UPDATE webhook_messages m
    SET claim_token = %(claim_token)s,
        claimed_until = now() + make_interval(secs => %(claim_seconds)s),
        attempts = m.attempts + 1,
        budget_used = m.budget_used + 1,
        updated_at = now()
    FROM due
    WHERE m.id = due.id
    RETURNING m.*
)
SELECT c.id, c.endpoint_id, c.tenant_id, c.event_type, c.occurred_at, c.data, c.attempts,
       c.budget_used, c.redelivery, c.created_at, e.url, e.secret_ciphertext, e.secret_key_id,
       CASE WHEN e.previous_secret_expires_at > now() THEN e.previous_secret_ciphertext END
           AS previous_secret_ciphertext,
       CASE WHEN e.previous_secret_expires_at > now() THEN e.previous_secret_key_id END
           AS previous_secret_key_id
FROM claimed c
JOIN webhook_endpoints e ON e.id = c.endpoint_id
ORDER BY c.created_at;

-- name: webhook_message_extend_claims
-- The claims of attempts still running in this process are kept: each pass extends those
-- that would expire within `within_seconds`, only while this process's claim token still
-- owns them. So a message whose attempt is running is never claimed again by another
-- process (or this one), however long that attempt is stalled; only a process that stops
-- passing (killed, or cut off from the database) lets its claims expire, and then its
-- messages are sent again.
UPDATE webhook_messages m
SET claimed_until = now() + make_interval(secs => %(claim_seconds)s)
FROM unnest(%(message_ids)s::uuid[], %(claim_tokens)s::uuid[]) AS r (message_id, claim_token)
WHERE m.id = r.message_id AND m.claim_token = r.claim_token AND m.status = 'pending'
  AND m.claimed_until < now() + make_interval(secs => %(within_seconds)s)
RETURNING m.id;

-- name: webhook_message_pass_begin
-- The delivery pass's transaction does not wait for its WAL flush: losing its last
-- commits in a database crash only means attempts sent again (the messages themselves were
-- written durably by the state change), which at-least-once delivery allows.
SET LOCAL synchronous_commit TO off;

-- name: webhook_message_record_attempts
-- Record finished attempts and settle their messages: delivered, failed (no attempt left,
-- or the receiver is gone), or pending again after `delay_seconds`; a failed probe of an
-- open circuit gives its attempt back to the message's budget (`refund`: the endpoint is
-- down, not the message at fault, so waiting out an outage never uses up a message). A message is settled
-- only by the claim that sent it (a process whose claim expired records its attempt but
-- leaves the message to the newer claim). Run after webhook_endpoints_lock, in the same
-- transaction, so that no message is deleted in between.
WITH r AS (
    SELECT *
    FROM unnest(%(message_ids)s::uuid[], %(claim_tokens)s::uuid[], %(endpoint_ids)s::uuid[],
                %(attempts)s::integer[], %(redelivery)s::boolean[],
                %(started_at)s::timestamptz[], %(outcomes)s::text[], %(status_codes)s::integer[],
                %(latency_ms)s::float8[], %(addresses)s::text[], %(signatures)s::integer[],
                %(errors)s::text[], %(next_status)s::text[], %(delay_seconds)s::float8[],
                %(refund)s::boolean[])
         AS r (message_id, claim_token, endpoint_id, attempt, redelivery, started_at, outcome,
               status_code, latency_ms, address, signatures, error, next_status,
               delay_seconds, refund)
), attempts AS (
    INSERT INTO webhook_attempts (message_id, endpoint_id, attempt, redelivery, started_at,
                                  outcome, status_code, latency_ms, address, signatures, error)
    SELECT r.message_id, r.endpoint_id, r.attempt, r.redelivery, r.started_at, r.outcome,
           r.status_code, r.latency_ms, r.address, r.signatures, r.error
    FROM r
    WHERE EXISTS (SELECT 1 FROM webhook_messages m WHERE m.id = r.message_id)
)
UPDATE webhook_messages m
SET status = r.next_status,
    next_attempt_at = CASE WHEN r.next_status = 'pending'
        THEN now() + make_interval(secs => r.delay_seconds) ELSE m.next_attempt_at END,
    delivered_at = CASE WHEN r.next_status = 'delivered' THEN now() END,
    budget_used = m.budget_used - CASE WHEN r.refund THEN 1 ELSE 0 END,
    claim_token = NULL,
    claimed_until = NULL,
    redelivery = false,
    last_error = r.error,
    updated_at = now()
FROM r
WHERE m.id = r.message_id AND m.claim_token = r.claim_token AND m.status = 'pending'
RETURNING m.id, m.status;

-- name: webhook_attempts_for_endpoint
-- An endpoint's attempts, newest first, after a keyset cursor (attempt id), with their
-- messages.
SELECT a.id, a.message_id, a.attempt, a.redelivery, a.started_at, a.outcome, a.status_code,
       a.latency_ms, a.address, a.signatures, a.error,
       m.event_type, m.subject_id, m.status AS message_status, m.next_attempt_at
FROM webhook_attempts a
JOIN webhook_messages m ON m.id = a.message_id
WHERE a.endpoint_id = %(endpoint_id)s
  AND (%(before_id)s::bigint IS NULL OR a.id < %(before_id)s::bigint)
  AND (%(outcome)s::text IS NULL OR a.outcome = %(outcome)s::text)
  AND (%(since)s::timestamptz IS NULL OR a.started_at >= %(since)s::timestamptz)
ORDER BY a.id DESC
LIMIT %(limit)s;

-- name: webhook_message_redeliver
-- Send an attempt's message again, with the same webhook-id and a fresh attempt budget:
-- due at once (a pending message waiting out its backoff is simply made due now). Only
-- for the tenant's own endpoint.
WITH target AS (
    SELECT a.message_id
    FROM webhook_attempts a
    JOIN webhook_endpoints e ON e.id = a.endpoint_id
    WHERE a.id = %(attempt_id)s AND a.endpoint_id = %(endpoint_id)s
      AND e.tenant_id = %(tenant_id)s
), requeued AS (
    UPDATE webhook_messages m
    SET status = 'pending',
        next_attempt_at = now(),
        budget_used = 0,
        redelivery = true,
        delivered_at = NULL,
        updated_at = now()
    FROM target
    WHERE m.id = target.message_id
    RETURNING m.*
)
SELECT requeued.*, pg_notify('webhook_messages', '')::text AS notified FROM requeued;

-- name: webhook_message_recover_since
-- "Recover": every message of the tenant's endpoint that failed for good (its attempts
-- used up) and was written at or after `since`, queued again with the same webhook-id, a
-- fresh attempt budget, due at once (Svix's "recover failed messages since"). Delivered
-- and pending messages are left as they are.
WITH requeued AS (
    UPDATE webhook_messages m
    SET status = 'pending',
        next_attempt_at = now(),
        budget_used = 0,
        redelivery = true,
        updated_at = now()
    FROM webhook_endpoints e
    WHERE e.id = m.endpoint_id AND e.id = %(endpoint_id)s AND e.tenant_id = %(tenant_id)s
      AND m.status = 'failed' AND m.created_at >= %(since)s
    RETURNING m.id
)
SELECT count(*) AS recovered, pg_notify('webhook_messages', '')::text AS notified
FROM requeued;

-- name: webhook_message_delete_before
-- Retention: settled messages (with their attempts) older than the retention, and pending
-- ones of disabled endpoints older than it; in bounded batches.
WITH old AS (
    SELECT m.id FROM webhook_messages m
    WHERE m.status <> 'pending' AND m.updated_at < now() - make_interval(secs => %(seconds)s)
    LIMIT %(limit)s
), stale AS (
    SELECT m.id FROM webhook_messages m
    JOIN webhook_endpoints e ON e.id = m.endpoint_id
    WHERE m.status = 'pending' AND NOT e.enabled
      AND m.created_at < now() - make_interval(secs => %(seconds)s)
    LIMIT %(limit)s
)
DELETE FROM webhook_messages
WHERE id IN (SELECT id FROM old UNION ALL SELECT id FROM stale)
RETURNING id;

-- name: webhook_message_gauges
-- Scrape-time gauges of the delivery process: backlog, its age, endpoints by state, and
-- the longest current run of failures of an enabled endpoint.
SELECT
    (SELECT count(*) FROM webhook_messages WHERE status = 'pending') AS pending,
    (SELECT coalesce(extract(epoch FROM now() - min(m.created_at)), 0)
     FROM webhook_messages m JOIN webhook_endpoints e ON e.id = m.endpoint_id
     WHERE m.status = 'pending' AND e.enabled)::float8 AS oldest_pending_age,
    (SELECT count(*) FROM webhook_endpoints
     WHERE enabled AND (circuit_open_until IS NULL OR circuit_open_until <= now())) AS closed,
    (SELECT count(*) FROM webhook_endpoints
     WHERE enabled AND circuit_open_until > now()) AS circuit_open,
    (SELECT count(*) FROM webhook_endpoints WHERE NOT enabled) AS disabled,
    (SELECT coalesce(max(extract(epoch FROM now() - failing_since)), 0)
     FROM webhook_endpoints WHERE enabled AND failing_since IS NOT NULL)::float8
        AS longest_failing;
