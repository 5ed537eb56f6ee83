-- The backlog of one queue, what KEDA's postgresql trigger scales its worker on: jobs that
-- are running, plus queued jobs that are due (a job waiting out its retry backoff is not
-- work for a worker yet). Whether the outbox has published them or the publisher holds them
-- back (broker window, tenant in-flight caps) does not matter: this counts job rows, where
-- a Redis list holds only what was already sent.
--
-- The chart replaces :queue with the component's queue (a quoted literal). An index-only
-- scan of export_jobs_backlog_idx (migration 0013) serves it; tests/chart/test_keda_backlog.py
-- runs the rendered query, as the read-only role below, against the migrated schema.
SELECT count(*)::float8 AS backlog
FROM export_jobs
WHERE queue = :queue
  AND status IN ('queued', 'running')
  AND (status = 'running' OR next_attempt_at <= now())
