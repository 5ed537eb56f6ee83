-- Bulk actions by filter (migration 0015): a durable run of "cancel (or replay) every job
-- this filter matched at `as_of`, at most `confirmed` of them", in keyset batches under a
-- lease. The targets are acted on through the same guarded statements as single actions
-- (jobs.sql job_request_cancel_many, the replay path of exportcore.replays), so a bulk
-- action racing single ones acts on each job once.

-- The targets of a bulk cancel are exports_bulk_cancel_match, those of a bulk replay
-- exports_bulk_replay_match (migration 0020), for the confirmation's count and for each
-- batch alike, so a run acts on exactly what its confirmation counted. A bulk cancel may
-- act on the jobs that are active, have no cancel requested yet, were created by `as_of`
-- and match the filter (export_jobs_active_idx: few rows, active jobs only); a bulk replay
-- on the dead letters that are open, were dead-lettered by `as_of` and match the filter,
-- `reason` being the job's error code (export_dead_letters_state_idx: state, reason, id).
-- `labels` (NULL: any), the tags and metadata pairs the job must all carry, is a
-- containment on the rows the function found, written out in each statement (a cancel's
-- candidates are the few active jobs; a replay's, the open dead letters' jobs).

-- name: bulk_action_cancel_count
SELECT count(*) AS n
FROM exports_bulk_cancel_match(%(as_of)s::timestamptz, %(status)s::text, %(queue)s::text,
     %(tenant_id)s::text, %(created_from)s::timestamptz, %(created_to)s::timestamptz) j
WHERE %(labels)s::jsonb IS NULL OR j.payload -> 'labels' @> %(labels)s::jsonb;

-- name: bulk_action_cancel_targets
-- The next batch after the cursor (job id), in id order.
SELECT j.id, j.tenant_id
FROM exports_bulk_cancel_match(%(as_of)s::timestamptz, %(status)s::text, %(queue)s::text,
     %(tenant_id)s::text, %(created_from)s::timestamptz, %(created_to)s::timestamptz) j
WHERE (%(after)s::uuid IS NULL OR j.id > %(after)s::uuid)
  AND (%(labels)s::jsonb IS NULL OR j.payload -> 'labels' @> %(labels)s::jsonb)
ORDER BY j.id
LIMIT %(limit)s;

-- name: bulk_action_replay_count
SELECT count(*) AS n
FROM exports_bulk_replay_match(%(as_of)s::timestamptz, %(reason)s::text, %(tenant_id)s::text,
     %(queue)s::text, %(created_from)s::timestamptz, %(created_to)s::timestamptz) d
WHERE (%(labels)s::jsonb IS NULL OR EXISTS (
      SELECT 1 FROM export_jobs lj
      WHERE lj.id = d.job_id AND lj.payload -> 'labels' @> %(labels)s::jsonb));

-- name: bulk_action_replay_targets
-- The next batch after the cursor (dead letter id), oldest first.
SELECT d.id, d.job_id, d.tenant_id
FROM exports_bulk_replay_match(%(as_of)s::timestamptz, %(reason)s::text, %(tenant_id)s::text,
     %(queue)s::text, %(created_from)s::timestamptz, %(created_to)s::timestamptz) d
WHERE d.id > coalesce(%(after)s::bigint, 0)
  AND (%(labels)s::jsonb IS NULL OR EXISTS (
      SELECT 1 FROM export_jobs lj
      WHERE lj.id = d.job_id AND lj.payload -> 'labels' @> %(labels)s::jsonb))
ORDER BY d.id
LIMIT %(limit)s;

-- name: bulk_action_as_of_future
-- Whether a start's `as_of` lies after the database's now: a preview's instant never does
-- (it is the database's now when it counted), and a later one would reach targets that
-- matched only after the preview.
SELECT %(as_of)s::timestamptz > now() AS future, now() AS now;

-- name: bulk_action_insert
-- A new run, or nothing when this request id already started one (the same confirmation
-- posted twice): the caller then reads that one. Without a `lease_token` the run waits for
-- the bulk runner (the recovery-scanner's, exportcore.bulk.BulkRunner), woken by the
-- NOTIFY `bulk_actions` sent at COMMIT; with one, the caller runs it itself (a synchronous
-- replay of one reason), holding the lease from the start.
WITH run AS (
    INSERT INTO bulk_actions (request_id, kind, filter, as_of, confirmed, audit_id, actor,
                              lease_token, lease_expires_at)
    VALUES (%(request_id)s, %(kind)s, %(filter)s, %(as_of)s, %(confirmed)s, %(audit_id)s,
            %(actor)s, %(lease_token)s::uuid,
            CASE WHEN %(lease_token)s::uuid IS NOT NULL
                 THEN now() + make_interval(secs => %(lease_seconds)s) END)
    ON CONFLICT (request_id) DO NOTHING
    RETURNING *
)
SELECT run.*,
       CASE WHEN run.lease_token IS NULL
            THEN pg_notify('bulk_actions', run.id::text)::text END AS notified
FROM run;

-- name: bulk_action_nudge
-- Wake the bulk runners (a resume asked by an operator): they look for runs nobody holds.
SELECT pg_notify('bulk_actions', %(bulk_id)s::text)::text AS notified;

-- fragment: bulk_action_columns
-- A run `b` with `interrupted`: running, and nobody renews its lease (it expired, or no
-- runner took a run written 30 s ago). The recovery-scanner's bulk runner picks such a run
-- up by itself; one that stays interrupted means no scanner is running.
b.*,
(b.state = 'running'
 AND coalesce(b.lease_expires_at, b.created_at + interval '30 seconds') < now())
    AS interrupted

-- name: bulk_action_get
SELECT {{bulk_action_columns}}
FROM bulk_actions b
WHERE b.id = %(bulk_id)s;

-- name: bulk_action_get_by_request
SELECT {{bulk_action_columns}}
FROM bulk_actions b
WHERE b.request_id = %(request_id)s;

-- name: bulk_action_claim
-- Take the run's lease: a new run, or one whose runner went silent (lease expired). A
-- run with a valid lease, or finished, matches nothing.
UPDATE bulk_actions
SET lease_token = %(lease_token)s,
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    updated_at = now()
WHERE id = %(bulk_id)s AND state = 'running'
  AND (lease_expires_at IS NULL OR lease_expires_at < now())
RETURNING *;

-- name: bulk_action_advance
-- One batch done, in the batch's transaction: the cursor, the counters, a renewed lease;
-- and the run's end (`state` done or stopped, with why). Guarded by the lease token: a
-- runner that lost its lease matches nothing, and its batch rolls back.
UPDATE bulk_actions
SET cursor = %(cursor)s,
    seen = seen + %(seen)s,
    acted = acted + %(acted)s,
    skipped = skipped + %(skipped)s,
    batches = batches + 1,
    state = %(state)s,
    stop_reason = %(stop_reason)s,
    lease_expires_at = CASE WHEN %(state)s = 'running'
                            THEN now() + make_interval(secs => %(lease_seconds)s) END,
    lease_token = CASE WHEN %(state)s = 'running' THEN lease_token END,
    finished_at = CASE WHEN %(state)s = 'running' THEN NULL ELSE now() END,
    updated_at = now()
WHERE id = %(bulk_id)s AND state = 'running' AND lease_token = %(lease_token)s
RETURNING *;

-- name: bulk_action_claim_next
-- The bulk runner's claim: the oldest run nobody holds (new: no lease yet; or its runner
-- died or stopped: lease expired), leased to this runner. SKIP LOCKED: two runners
-- claiming at once take two different runs (or one takes it and the other nothing), and
-- a run held by a valid lease matches nothing, so no run is ever run by two at once.
UPDATE bulk_actions b
SET lease_token = %(lease_token)s,
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    updated_at = now()
FROM (SELECT id FROM bulk_actions
      WHERE state = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < now())
      ORDER BY id
      LIMIT 1
      FOR UPDATE SKIP LOCKED) next
WHERE b.id = next.id
RETURNING b.*;

-- name: bulk_action_release
-- A runner asked to stop (TERM) hands its run back between two batches: the lease ends
-- now, so the next runner's claim takes it at once. Guarded by the token.
UPDATE bulk_actions
SET lease_expires_at = now(), updated_at = now()
WHERE id = %(bulk_id)s AND state = 'running' AND lease_token = %(lease_token)s
RETURNING id;

-- name: bulk_action_running
-- Runs whose lease expired (their runner died): what a runner may resume.
SELECT id FROM bulk_actions
WHERE state = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < now())
ORDER BY id
LIMIT %(limit)s;
