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
