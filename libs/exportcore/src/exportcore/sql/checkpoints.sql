-- Checkpoints of bulk renders (docs/architecture.md "Checkpoints"). A checkpoint is written
-- and taken over only under the job's CURRENT lease token, while that lease is unexpired: a
-- holder that lost its lease (a newer claim replaced its token) matches nothing, so its late
-- writes never move the checkpoint. The row's own `lease_token` names the holder whose
-- unfinished write (`artifact_key`) holds the durable prefix.

-- The lease holder's statements (checkpoint_save, checkpoint_take_over,
-- checkpoint_discard) start with the CTE `holder`: the job, if it is running under
-- `lease_token` with an unexpired lease (exports_lease_holder, migration 0020).

-- name: checkpoint_get
-- The job's checkpoint, if any (read at the start of a bulk render).
SELECT job_id, lease_token, layout, artifact_key, ordinal, rows, bytes, sha256, upload_id,
       parts, renderer, resumes, carried_rows, updated_at
FROM export_checkpoints
WHERE job_id = %(job_id)s;

-- name: checkpoint_segments
-- The renderer state of a checkpoint: every segment up to its cursor, in order.
SELECT ordinal, state
FROM export_checkpoint_segments
WHERE job_id = %(job_id)s AND ordinal <= %(ordinal)s
ORDER BY ordinal;

-- name: checkpoint_save
-- Record the durable prefix reached at a chunk boundary (cursor `ordinal`), with the
-- renderer state added since the previous checkpoint (`state`, a segment), by the lease
-- holder. A first checkpoint inserts the row; a later one updates it only while the row is
-- this token's (written or taken over by it). No row back: refused (the lease is lost).
WITH holder AS (
    SELECT h.id FROM exports_lease_holder(%(job_id)s, %(lease_token)s) h
), saved AS (
    INSERT INTO export_checkpoints AS c (
        job_id, lease_token, layout, artifact_key, ordinal, rows, bytes, sha256, upload_id,
        parts, renderer)
    SELECT h.id, %(lease_token)s, %(layout)s, %(artifact_key)s, %(ordinal)s, %(rows)s,
           %(nbytes)s, %(sha256)s, %(upload_id)s, %(parts)s, %(renderer)s
    FROM holder h
    ON CONFLICT (job_id) DO UPDATE
    SET artifact_key = EXCLUDED.artifact_key, layout = EXCLUDED.layout,
        ordinal = EXCLUDED.ordinal, rows = EXCLUDED.rows, bytes = EXCLUDED.bytes,
        sha256 = EXCLUDED.sha256, upload_id = EXCLUDED.upload_id, parts = EXCLUDED.parts,
        renderer = EXCLUDED.renderer, updated_at = now()
    WHERE c.lease_token = EXCLUDED.lease_token AND EXCLUDED.ordinal > c.ordinal
    RETURNING c.job_id, c.ordinal, c.rows, c.bytes
), segment AS (
    INSERT INTO export_checkpoint_segments (job_id, ordinal, state)
    SELECT s.job_id, s.ordinal, %(state)s FROM saved s
    ON CONFLICT (job_id, ordinal) DO UPDATE SET state = EXCLUDED.state
)
SELECT job_id, ordinal, rows, bytes FROM saved;

-- name: checkpoint_take_over
-- The new holder takes the checkpoint written under `old_token`, once it has copied the
-- durable prefix under its own key: the row becomes its own (`lease_token`, the new key,
-- upload and parts), `resumes` + 1, `carried_rows` = the notes it did not render again,
-- and the job's history gets a `resumed` event (same statement) with what the takeover
-- cost (`seconds`: copying and re-hashing the prefix, rebuilding the renderer).
WITH holder AS (
    SELECT h.id FROM exports_lease_holder(%(job_id)s, %(lease_token)s) h
), taken AS (
    UPDATE export_checkpoints c
    SET lease_token = %(lease_token)s,
        artifact_key = %(artifact_key)s,
        upload_id = %(upload_id)s,
        parts = %(parts)s,
        resumes = c.resumes + 1,
        carried_rows = c.rows,
        updated_at = now()
    FROM holder h
    WHERE c.job_id = h.id AND c.lease_token = %(old_token)s AND c.ordinal = %(ordinal)s
    RETURNING c.job_id, c.ordinal, c.rows, c.bytes, c.resumes
), job AS MATERIALIZED (
    -- the job row locked against a delete while its event is written (INV-17: history
    -- events have no foreign key to check that)
    SELECT j.id, j.attempts FROM export_jobs j WHERE j.id = %(job_id)s FOR KEY SHARE
), history AS (
    INSERT INTO export_job_events (job_id, kind, attempt, lease_token, detail)
    SELECT t.job_id, 'resumed', j.attempts, %(lease_token)s,
           jsonb_build_object('notes', t.rows, 'bytes', t.bytes, 'resumes', t.resumes,
                              'seconds', %(seconds)s::float8,
                              'from_lease_token', %(old_token)s::text)
    FROM taken t JOIN job j ON j.id = t.job_id
)
SELECT job_id, ordinal, rows, bytes, resumes FROM taken;

-- name: checkpoint_discard
-- Drop a checkpoint that cannot be trusted, or one whose job is done, with its segments;
-- by the lease holder only. Returns what was dropped (the prefix to delete).
WITH holder AS (
    SELECT h.id FROM exports_lease_holder(%(job_id)s, %(lease_token)s) h
), segments AS (
    DELETE FROM export_checkpoint_segments s USING holder h WHERE s.job_id = h.id
), dropped AS (
    DELETE FROM export_checkpoints c USING holder h
    WHERE c.job_id = h.id
    RETURNING c.job_id, c.artifact_key, c.upload_id, c.parts, c.bytes, c.sha256
)
SELECT job_id, artifact_key, upload_id, parts, bytes, sha256 FROM dropped;

-- name: checkpoint_delete_finished
-- After a finish (the token no longer holds a running lease): the job's checkpoint and
-- segments, only if the job succeeded under `lease_token`.
WITH done AS (
    SELECT j.id FROM export_jobs j
    WHERE j.id = %(job_id)s AND j.status = 'succeeded' AND j.lease_token = %(lease_token)s
), segments AS (
    DELETE FROM export_checkpoint_segments s USING done d WHERE s.job_id = d.id
)
DELETE FROM export_checkpoints c USING done d WHERE c.job_id = d.id
RETURNING c.job_id;

-- name: checkpoint_keys_in_use_many
-- The unfinished writes that checkpoints of unfinished jobs still hold (orphan cleanup keeps
-- them): job id and artifact key, for the jobs asked about.
SELECT c.job_id, c.artifact_key
FROM export_checkpoints c
JOIN export_jobs j ON j.id = c.job_id
WHERE c.job_id = ANY(%(job_ids)s::uuid[]) AND j.status IN ('queued', 'running');

-- name: checkpoint_progress
-- What a job's checkpoint carries (the status resource): notes and bytes made durable,
-- takeovers, notes carried over by the latest takeover.
SELECT rows, bytes, resumes, carried_rows, updated_at
FROM export_checkpoints
WHERE job_id = %(job_id)s;
