-- The notes source: what users export.

-- name: note_upsert_by_path
-- Import one file: idempotent per (tenant, relative path). Returns whether it was new.
INSERT INTO notes (tenant_id, source_path, title, content, pinned, updated_at)
VALUES (%(tenant_id)s, %(source_path)s, %(title)s, %(content)s, %(pinned)s, %(updated_at)s)
ON CONFLICT ON CONSTRAINT notes_tenant_source_path_key DO UPDATE
SET title = EXCLUDED.title, content = EXCLUDED.content, pinned = EXCLUDED.pinned,
    updated_at = EXCLUDED.updated_at
WHERE (notes.title, notes.content, notes.pinned, notes.updated_at)
      IS DISTINCT FROM (EXCLUDED.title, EXCLUDED.content, EXCLUDED.pinned, EXCLUDED.updated_at)
RETURNING id, (xmax = 0) AS inserted;

-- name: notes_existing_ids
-- Which of the requested ids belong to the tenant.
SELECT coalesce(array_agg(id), '{}') AS ids
FROM notes
WHERE tenant_id = %(tenant_id)s AND id = ANY(%(note_ids)s::bigint[]);

-- name: notes_count
SELECT count(*) AS n FROM notes WHERE tenant_id = %(tenant_id)s;

-- name: notes_page
-- The tenant's notes by id after a cursor (`exportctl notes list`): metadata and size only,
-- never the content. Reads notes_tenant_id_idx (tenant_id, id).
SELECT id, title, source_path, pinned, octet_length(content) AS bytes, updated_at, created_at
FROM notes
WHERE tenant_id = %(tenant_id)s AND (%(after)s::bigint IS NULL OR id > %(after)s::bigint)
ORDER BY id
LIMIT %(limit)s;

-- name: notes_delete_many
-- Delete notes of the tenant by id (`exportctl notes delete`); the trigger
-- notes_write_tombstone (migration 0013) leaves a tombstone for each, which the next delta
-- export carries. Returns the ids deleted.
DELETE FROM notes
WHERE tenant_id = %(tenant_id)s AND id = ANY(%(note_ids)s::bigint[])
RETURNING id;

-- name: notes_delete_not_in_paths
-- An import that replaces the tenant's notes (`exportctl notes import --replace`): delete
-- every imported note whose source path is not among `paths` (tombstones as above).
DELETE FROM notes
WHERE tenant_id = %(tenant_id)s AND source_path IS NOT NULL
  AND NOT (source_path = ANY(%(paths)s::text[]))
RETURNING id;

-- The version store (note_versions, docs/architecture.md INV-18 snapshot-by-reference):
-- written by the note triggers only; pruned by the recovery-scanner in two steps, a grace
-- period apart (exportcore.note_versions): mark, wait for every transaction that was in
-- progress at the mark, sweep.

-- name: note_versions_prune_mark
-- Step 1: at most `limit` superseded versions that no job that may still render names:
-- a queued or running job (a checkpoint resumes one of these), or a failed one (a replay,
-- single or bulk, copies its items; a cancelled replay leaves it failed and replayable).
-- A succeeded or cancelled job never renders again, a redrive with a corrected input reads
-- the notes anew, and a delta's base is read through its pg_snapshot, never its items.
WITH live AS MATERIALIZED (
    SELECT DISTINCT i.note_id, i.version
    FROM export_jobs j
    JOIN export_job_items i ON i.job_id = j.id
    WHERE j.status IN ('queued', 'running', 'failed') AND NOT i.deleted
)
SELECT v.note_id, v.version
FROM note_versions v
WHERE NOT EXISTS (SELECT 1 FROM live l WHERE l.note_id = v.note_id AND l.version = v.version)
LIMIT %(limit)s;

-- name: note_versions_prune_in_progress
-- Step 1, after the mark (a later statement, so it reads the backends after the mark's
-- snapshot): every transaction in progress in this database, by (pid, xact_start), which
-- identifies one transaction of one backend. Any transaction that may still commit a
-- reference to a marked version is among them (the argument: docs/architecture.md INV-18).
SELECT pid, xact_start
FROM pg_stat_activity
WHERE datname = current_database() AND xact_start IS NOT NULL AND pid <> pg_backend_pid();

-- name: note_versions_prune_waiting
-- Step 2's gate: how many of the transactions step 1 saw are still in progress (the same
-- backend with the same transaction start), and how many prepared transactions this
-- database holds (a prepared transaction has left its backend, so it cannot be waited
-- for by identity: while one exists nothing is swept).
SELECT (SELECT count(*)
        FROM pg_stat_activity a
        JOIN unnest(%(pids)s::int[], %(starts)s::timestamptz[]) AS w (pid, xact_start)
          ON a.pid = w.pid AND a.xact_start = w.xact_start)::int AS waiting,
       (SELECT count(*) FROM pg_prepared_xacts p
        WHERE p.database = current_database())::int AS prepared;

-- name: note_versions_prune_sweep
-- Step 2: delete the marked versions that are still named by no job that may render (the
-- transactions step 1 waited for have ended, so every reference they wrote is visible to
-- this statement). Returns how many were deleted.
WITH live AS MATERIALIZED (
    SELECT DISTINCT i.note_id, i.version
    FROM export_jobs j
    JOIN export_job_items i ON i.job_id = j.id
    WHERE j.status IN ('queued', 'running', 'failed') AND NOT i.deleted
), gone AS (
    DELETE FROM note_versions v
    USING unnest(%(note_ids)s::bigint[], %(versions)s::bigint[]) AS c (note_id, version)
    WHERE v.note_id = c.note_id AND v.version = c.version
      AND NOT EXISTS (
          SELECT 1 FROM live l WHERE l.note_id = v.note_id AND l.version = v.version)
    RETURNING 1
)
SELECT count(*)::int AS n FROM gone;
