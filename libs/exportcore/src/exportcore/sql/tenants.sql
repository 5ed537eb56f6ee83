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
SELECT k.id, k.tenant_id, k.key_hash, k.scopes
FROM api_keys k
WHERE k.key_hash = %(key_hash)s AND k.revoked_at IS NULL;
