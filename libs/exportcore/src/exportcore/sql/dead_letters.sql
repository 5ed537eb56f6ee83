-- Dead letters: the failed jobs that need a person. Rows are written by the job_fail_*
-- transitions and the scanner, never updated; replay creates a new job instead.

-- name: dead_letters_page
-- Newest first, keyset pagination on id, optionally one reason.
SELECT d.id, d.job_id, d.tenant_id, d.reason, d.detail, d.attempts, d.created_at,
       (SELECT r.id FROM export_jobs r WHERE r.replay_of = d.job_id ORDER BY r.created_at DESC LIMIT 1)
           AS replayed_by
FROM export_dead_letters d
WHERE (%(reason)s::text IS NULL OR d.reason = %(reason)s)
  AND (%(before)s::bigint IS NULL OR d.id < %(before)s)
ORDER BY d.id DESC
LIMIT %(limit)s;
