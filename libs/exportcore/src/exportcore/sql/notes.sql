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
