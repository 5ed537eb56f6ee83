-- Tenant API keys (only a SHA-256 of each key is stored; RFC 6750 bearer tokens).

-- name: api_key_insert
INSERT INTO api_keys (id, tenant_id, key_hash, prefix, scopes, label)
VALUES (%(key_id)s, %(tenant_id)s, %(key_hash)s, %(prefix)s, %(scopes)s, %(label)s)
RETURNING id, tenant_id, prefix, scopes, label, created_at, revoked_at;

-- name: api_key_lookup
-- The active key with this hash; the caller still compares hashes in constant time.
SELECT k.id, k.tenant_id, k.key_hash, k.scopes, k.prefix, k.label
FROM api_keys k
WHERE k.key_hash = %(key_hash)s AND k.revoked_at IS NULL;

-- name: api_key_revoke
-- Revoke the active key with this id or display prefix, only when exactly one matches.
WITH matches AS (
    SELECT id FROM api_keys
    WHERE (id::text = %(key)s OR prefix = %(key)s) AND revoked_at IS NULL
)
UPDATE api_keys SET revoked_at = now()
WHERE id IN (SELECT id FROM matches) AND (SELECT count(*) FROM matches) = 1
RETURNING id, tenant_id, prefix, scopes, label, created_at, revoked_at;

-- name: api_key_list
SELECT id, tenant_id, prefix, scopes, label, created_at, revoked_at
FROM api_keys
WHERE (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)
ORDER BY tenant_id, created_at;
