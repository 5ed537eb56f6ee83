-- Scrape-time gauges (the recovery-scanner's /metrics). Read only, one short transaction.

-- name: metrics_jobs_by_status
SELECT status, queue, count(*) AS n FROM export_jobs GROUP BY status, queue;

-- name: metrics_oldest_queued
-- Age of the oldest due queued job per queue (jobs waiting for a backoff are not late, nor
-- are those an operator's pause holds: dispatch_pauses.sql, shown by their own gauges).
SELECT j.queue, extract(epoch FROM now() - min(j.next_attempt_at))::float8 AS age
FROM export_jobs j
WHERE j.status = 'queued' AND j.next_attempt_at <= now()
  AND NOT EXISTS (SELECT 1 FROM dispatch_pauses p
                  WHERE p.queue = j.queue
                    AND (p.tenant_id IS NULL OR p.tenant_id = j.tenant_id))
GROUP BY j.queue;

-- name: metrics_outbox
-- Unsent events, and the age of the oldest due one that is not paused (a paused event
-- waits on purpose: the outbox-stuck alert must not read it as a publisher fault).
SELECT count(*) AS unpublished,
       coalesce(extract(epoch FROM now() - min(o.available_at)
                FILTER (WHERE o.available_at <= now() AND NOT o.paused)), 0)::float8
           AS oldest_age
FROM (SELECT e.available_at,
             EXISTS (SELECT 1 FROM dispatch_pauses p
                     WHERE p.queue = e.queue
                       AND (p.tenant_id IS NULL OR p.tenant_id = e.tenant_id)) AS paused
      FROM export_outbox e
      WHERE e.sent_at IS NULL) o;

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
-- due events only. `bulk_cap` / `fast_cap`: the defaults. A pair an operator paused
-- (dispatch_pauses.sql) has no oldest age and nothing held back by its cap: its work waits
-- on purpose, which the pause gauges show.
WITH active AS (
    SELECT a.tenant_id, a.queue,
           count(*) FILTER (WHERE a.status = 'queued') AS queued,
           count(*) FILTER (WHERE a.status = 'running') AS running,
           coalesce(extract(epoch FROM now() - min(a.next_attempt_at)
                    FILTER (WHERE a.status = 'queued' AND a.next_attempt_at <= now()
                            AND NOT EXISTS (SELECT 1 FROM dispatch_pauses p
                                            WHERE p.queue = a.queue
                                              AND (p.tenant_id IS NULL
                                                   OR p.tenant_id = a.tenant_id)))),
                    0)::float8
               AS oldest_age
    FROM export_jobs a
    WHERE a.status IN ('queued', 'running')
    GROUP BY a.tenant_id, a.queue
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
    WHERE NOT EXISTS (SELECT 1 FROM dispatch_pauses p
                      WHERE p.queue = g.queue
                        AND (p.tenant_id IS NULL OR p.tenant_id = g.tenant_id))
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
