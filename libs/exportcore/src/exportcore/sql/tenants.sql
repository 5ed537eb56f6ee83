-- Tenants and their API keys (only a SHA-256 of each key is stored).

-- name: tenant_upsert
INSERT INTO tenants (id, name) VALUES (%(tenant_id)s, %(name)s)
ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name
RETURNING *;

-- name: tenant_get
SELECT * FROM tenants WHERE id = %(tenant_id)s;

-- name: apikey_insert
INSERT INTO api_keys (id, tenant_id, key_hash, prefix, scopes, label)
VALUES (%(key_id)s, %(tenant_id)s, %(key_hash)s, %(prefix)s, %(scopes)s, %(label)s)
RETURNING id, tenant_id, prefix, scopes, label, created_at, revoked_at;

-- name: apikey_lookup
-- The active key with this hash; the caller still compares hashes in constant time.
SELECT k.id, k.tenant_id, k.key_hash, k.scopes, k.prefix, k.label
FROM api_keys k
WHERE k.key_hash = %(key_hash)s AND k.revoked_at IS NULL;

-- name: tenant_set_quota
-- Override (or, with NULL, reset to the default) the tenant's quota of active jobs.
UPDATE tenants SET max_active_jobs = %(quota)s WHERE id = %(tenant_id)s RETURNING *;

-- name: tenant_set_rate
-- Override (or, with NULLs, reset to the defaults) the tenant's submit token bucket.
UPDATE tenants SET submit_rate = %(rate)s, submit_burst = %(burst)s
WHERE id = %(tenant_id)s
RETURNING *;

-- name: tenant_set_in_flight
-- Override (or, with NULL, reset to the default) the tenant's in-flight cap of each queue
-- (fair dispatch: the outbox claim reads it on its next pass).
UPDATE tenants SET bulk_in_flight = %(bulk)s, fast_in_flight = %(fast)s
WHERE id = %(tenant_id)s
RETURNING *;

-- name: tenant_submit_limit
SELECT submit_rate, submit_burst FROM tenants WHERE id = %(tenant_id)s;

-- name: apikey_revoke
-- Revoke the active key with this id or display prefix, only when exactly one matches.
WITH matches AS (
    SELECT id FROM api_keys
    WHERE (id::text = %(key)s OR prefix = %(key)s) AND revoked_at IS NULL
)
UPDATE api_keys SET revoked_at = now()
WHERE id IN (SELECT id FROM matches) AND (SELECT count(*) FROM matches) = 1
RETURNING id, tenant_id, prefix, scopes, label, created_at, revoked_at;

-- name: apikey_list
SELECT id, tenant_id, prefix, scopes, label, created_at, revoked_at
FROM api_keys
WHERE (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)
ORDER BY tenant_id, created_at;
