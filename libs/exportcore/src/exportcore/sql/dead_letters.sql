-- Dead letters: the failed jobs that need a person. Written by the job_fail_* transitions
-- and the scanner as `open`; an operator's replay moves one to `replayed` (with the replay
-- job, who and when), a resolution to `resolved` (who, when, an optional note). The reason,
-- detail and attempts never change.

-- The API and the console read a dead letter as the view export_dead_letter_rows shows it
-- (migration 0020): the dead letter `d`'s columns with its job's queue and the status of
-- the replay recorded on it (`replay_status`).

-- name: dead_letters_page
-- Newest first, keyset pagination on id; optionally one state, one reason, one tenant.
SELECT * FROM export_dead_letter_rows d
WHERE (%(reason)s::text IS NULL OR d.reason = %(reason)s)
  AND (%(state)s::text IS NULL OR d.state = %(state)s)
  AND (%(tenant_id)s::text IS NULL OR d.tenant_id = %(tenant_id)s)
  AND (%(before)s::bigint IS NULL OR d.id < %(before)s)
ORDER BY d.id DESC
LIMIT %(limit)s;

-- name: dead_letter_get
SELECT * FROM export_dead_letter_rows d
WHERE d.id = %(dead_letter_id)s;

-- name: dead_letter_resolve
-- open | replayed -> resolved, by an operator, with an optional note. A resolved dead
-- letter matches nothing (it keeps who resolved it first).
UPDATE export_dead_letters
SET state = 'resolved', resolved_at = now(), resolved_by = %(actor)s, resolution_note = %(note)s
WHERE id = %(dead_letter_id)s AND state IN ('open', 'replayed')
RETURNING id;

-- name: dead_letter_mark_replayed
-- The job's dead letter -> replayed by `replay_job_id`, in the transaction that wrote the
-- replay. Any state: an operator may replay a job whose dead letter was resolved.
UPDATE export_dead_letters
SET state = 'replayed', replay_job_id = %(replay_job_id)s, replayed_at = now(),
    replayed_by = %(actor)s
WHERE job_id = %(job_id)s
RETURNING id;

-- name: dead_letters_open_for_reason
-- The open dead letters with this reason (optionally of one tenant), oldest first, after
-- `after` (keyset): the work list of a bulk replay.
SELECT id, job_id, tenant_id
FROM export_dead_letters
WHERE state = 'open' AND reason = %(reason)s
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND id > %(after)s
ORDER BY id
LIMIT %(limit)s;
