-- Manifests of rendered artifacts (exportcore.manifests). A manifest of an export of every
-- note (the only kind a delta can take as its base) is recorded by the lease holder right
-- before its finish, under its lease token; the one of a succeeded job
-- is the row whose token is the job's (the finish keeps the winning token), so a delta's
-- base is always the manifest of the artifact that was published.

-- name: manifest_record_many
-- Record (or replace, for a newer token of the same job) the manifests of a batch, each
-- only while its job runs under that token.
INSERT INTO export_manifests AS m (job_id, lease_token, sha256, key_id, notes, tombstones)
SELECT r.job_id, r.lease_token, r.sha256, r.key_id, r.notes, r.tombstones
FROM unnest(%(job_ids)s::uuid[], %(lease_tokens)s::uuid[], %(sha256s)s::text[],
            %(key_ids)s::text[], %(notes)s::int[], %(tombstones)s::int[])
    AS r (job_id, lease_token, sha256, key_id, notes, tombstones)
JOIN export_jobs j ON j.id = r.job_id AND j.status = 'running' AND j.lease_token = r.lease_token
ON CONFLICT (job_id) DO UPDATE
SET lease_token = EXCLUDED.lease_token, sha256 = EXCLUDED.sha256, key_id = EXCLUDED.key_id,
    notes = EXCLUDED.notes, tombstones = EXCLUDED.tombstones, created_at = now()
RETURNING m.job_id;
