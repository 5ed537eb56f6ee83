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
-- events beyond cap - in flight, read with the claim's own exports_pair_load of migration
-- 0020; no event is being marked, so `sent_ids` is empty): what the per-tenant gauges (top
-- N + "other") are made of. Reads the active jobs, the pending events and the tenants with
-- due events only. `bulk_cap` / `fast_cap`: the defaults.
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
    SELECT g.tenant_id, g.queue,
           greatest(0, g.n - greatest(0, l.cap - l.in_flight)) AS held_back
    FROM due g
    LEFT JOIN tenants t ON t.id = g.tenant_id
    CROSS JOIN LATERAL exports_pair_load(g.tenant_id, g.queue, t.fast_in_flight, t.bulk_in_flight,
                                         %(fast_cap)s, %(bulk_cap)s, %(sent_ids)s::uuid[]) l
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
