-- Reconciling what the broker (Redis) holds against the jobs (read-only). Messages carry
-- only a job id, and their task id is the outbox event id (docs/architecture.md
-- INV-2 message-carries-ids-only).

-- name: broker_jobs_by_id
-- The jobs that messages name: status and queue (ids that match nothing are unknown).
SELECT id, status, queue FROM export_jobs WHERE id = ANY(%(job_ids)s::uuid[]);

-- name: broker_sent_ages
-- How long ago each outbox event (= message) was sent, seconds: the age of a ready message.
SELECT id, extract(epoch FROM now() - sent_at)::float8 AS age
FROM export_outbox
WHERE id = ANY(%(message_ids)s::uuid[]) AND sent_at IS NOT NULL;

-- name: broker_queued_without_pending_event
-- Queued jobs that wait for a message already sent (no unsent outbox event), dispatched (or
-- created) at least `grace_seconds` ago: each should have a message in the broker.
SELECT j.id, j.queue, j.dispatch_count, j.last_dispatched_at,
       extract(epoch FROM now() - coalesce(j.last_dispatched_at, j.created_at))::float8 AS waiting
FROM export_jobs j
WHERE j.status = 'queued'
  AND coalesce(j.last_dispatched_at, j.created_at) < now() - make_interval(secs => %(grace_seconds)s)
  AND NOT EXISTS (SELECT 1 FROM export_outbox o WHERE o.job_id = j.id AND o.sent_at IS NULL)
ORDER BY coalesce(j.last_dispatched_at, j.created_at)
LIMIT %(limit)s;
