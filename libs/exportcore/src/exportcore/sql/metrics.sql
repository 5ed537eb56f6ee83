-- Scrape-time gauges (the recovery-scanner's /metrics). Read only, one short transaction.

-- name: metrics_jobs_by_status
SELECT status, queue, count(*) AS n FROM export_jobs GROUP BY status, queue;

-- name: metrics_oldest_queued
-- Age of the oldest due queued job per queue (jobs waiting for a backoff are not late).
SELECT queue, extract(epoch FROM now() - min(next_attempt_at))::float8 AS age
FROM export_jobs
WHERE status = 'queued' AND next_attempt_at <= now()
GROUP BY queue;

-- name: metrics_outbox
SELECT count(*) AS unpublished,
       coalesce(extract(epoch FROM now() - min(available_at) FILTER (WHERE available_at <= now())), 0)::float8
           AS oldest_age
FROM export_outbox
WHERE sent_at IS NULL;

-- name: metrics_expired_leases
SELECT count(*) AS n FROM export_jobs WHERE status = 'running' AND lease_expires_at <= now();

-- name: metrics_dead_letters
SELECT reason, count(*) AS n FROM export_dead_letters GROUP BY reason;

-- name: metrics_tenant_backlog
-- Active jobs per tenant and queue, with the age of the tenant's oldest due queued job and
-- how many of its due outbox events its in-flight cap holds back (fair dispatch: due
-- events beyond cap - in flight, in flight counted as the claim counts it): what the
-- per-tenant gauges (top N + "other") are made of. Reads the active jobs, the pending
-- events and the tenants with due events only. `bulk_cap` / `fast_cap`: the defaults.
WITH active AS (
    SELECT tenant_id, queue,
           count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'running') AS running,
           coalesce(extract(epoch FROM now() - min(next_attempt_at)
                    FILTER (WHERE status = 'queued' AND next_attempt_at <= now())), 0)::float8
               AS oldest_age
    FROM export_jobs
    WHERE status IN ('queued', 'running')
    GROUP BY tenant_id, queue
), due AS (
    SELECT tenant_id, queue, count(*) AS n
    FROM export_outbox
    WHERE sent_at IS NULL AND available_at <= now()
      AND (claimed_until IS NULL OR claimed_until < now())
    GROUP BY tenant_id, queue
), held AS (
    SELECT d.tenant_id, d.queue,
           greatest(0, d.n - greatest(0, c.cap - f.in_flight)) AS held_back
    FROM due d
    LEFT JOIN tenants t ON t.id = d.tenant_id
    CROSS JOIN LATERAL (
        SELECT CASE WHEN d.queue = 'exports.fast' THEN coalesce(t.fast_in_flight, %(fast_cap)s)
                    ELSE coalesce(t.bulk_in_flight, %(bulk_cap)s) END AS cap
    ) c
    CROSS JOIN LATERAL (
        SELECT count(*) AS in_flight FROM (
            SELECT j.id FROM export_jobs j
            WHERE j.tenant_id = d.tenant_id AND j.queue = d.queue
              AND (j.status = 'running'
                   OR (j.status = 'queued' AND j.last_dispatched_at IS NOT NULL))
              AND (j.status = 'running' OR NOT EXISTS (
                  SELECT 1 FROM export_outbox p
                  WHERE p.job_id = j.id AND p.sent_at IS NULL
                    AND (p.claimed_until IS NULL OR p.claimed_until < now())))
            UNION
            SELECT o.job_id FROM export_outbox o
            JOIN export_jobs j ON j.id = o.job_id
            WHERE o.tenant_id = d.tenant_id AND o.queue = d.queue
              AND o.sent_at IS NULL AND o.claim_token IS NOT NULL
              AND o.claimed_until >= now()
              AND j.status IN ('queued', 'running')
        ) busy
    ) f
)
SELECT a.tenant_id, a.queue, a.queued, a.running, a.oldest_age,
       coalesce(h.held_back, 0) AS held_back
FROM active a
LEFT JOIN held h ON h.tenant_id = a.tenant_id AND h.queue = a.queue;

-- name: metrics_schedules
-- Schedules by state: enabled (and of those, backing off after a refusal) or paused (why).
SELECT enabled, coalesce(paused_reason, '') AS reason,
       count(*) AS n,
       count(*) FILTER (WHERE enabled AND retry_at IS NOT NULL) AS backing_off
FROM export_schedules
GROUP BY enabled, coalesce(paused_reason, '');
