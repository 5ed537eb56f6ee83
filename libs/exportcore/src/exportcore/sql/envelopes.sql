-- Envelopes of encrypted artifacts (exportcore.encryption): what binds an age file to its
-- export's manifest, signed, kept outside the ciphertext. Recorded by the lease holder in
-- the finish's transaction under its lease token, like a manifest (manifests.sql); the
-- envelope of a succeeded job is the row whose token is the job's.

-- name: envelope_recipients_many
-- The age recipients of each claimed job that has any: the request's (its payload's
-- `recipients`) and the tenant's (`tenants.age_recipients`, as they are at render time),
-- sorted, without repeats. A job without recipients has no row.
SELECT r.job_id, r.recipients
FROM (
    SELECT j.id AS job_id,
           ARRAY(
               SELECT DISTINCT x FROM (
                   SELECT jsonb_array_elements_text(
                              coalesce(j.payload -> 'recipients', '[]'::jsonb)) AS x
                   UNION ALL
                   SELECT unnest(coalesce(t.age_recipients, '{}'::text[]))
               ) a
               ORDER BY x
           ) AS recipients
    FROM export_jobs j
    JOIN tenants t ON t.id = j.tenant_id
    WHERE j.id = ANY(%(job_ids)s::uuid[])
) r
WHERE cardinality(r.recipients) > 0;

-- name: envelope_record_many
-- Record (or replace, for a newer token of the same job) the envelopes of a batch, each
-- only while its job runs under that token.
INSERT INTO export_envelopes AS e (job_id, lease_token, header, signature)
SELECT r.job_id, r.lease_token, r.header, r.signature
FROM unnest(%(job_ids)s::uuid[], %(lease_tokens)s::uuid[], %(headers)s::jsonb[],
            %(signatures)s::jsonb[])
    AS r (job_id, lease_token, header, signature)
JOIN export_jobs j ON j.id = r.job_id AND j.status = 'running' AND j.lease_token = r.lease_token
ON CONFLICT (job_id) DO UPDATE
SET lease_token = EXCLUDED.lease_token, header = EXCLUDED.header,
    signature = EXCLUDED.signature, created_at = now()
RETURNING e.job_id;

-- name: envelope_get
-- The envelope of a tenant's succeeded export (the one of the artifact published: the
-- job's lease token); no row for an export that is not encrypted or not succeeded.
SELECT e.header, e.signature, e.created_at
FROM export_envelopes e
JOIN export_jobs j ON j.id = e.job_id AND j.lease_token = e.lease_token
WHERE e.job_id = %(job_id)s AND j.tenant_id = %(tenant_id)s AND j.status = 'succeeded';
