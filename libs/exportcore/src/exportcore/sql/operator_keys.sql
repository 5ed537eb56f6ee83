-- Operator keys: cross-tenant (/v1/admin) access, tied to no tenant. Only a SHA-256 of
-- each key is stored; rows are created by `exportctl operator-key create` only.

-- name: operator_key_insert
INSERT INTO operator_keys (id, key_hash, prefix, label, role)
VALUES (%(key_id)s, %(key_hash)s, %(prefix)s, %(label)s, %(role)s)
RETURNING id, prefix, label, role, created_at, revoked_at;

-- name: operator_key_lookup
-- The active key with this hash; the caller still compares hashes in constant time.
SELECT id, key_hash, prefix, label, role
FROM operator_keys
WHERE key_hash = %(key_hash)s AND revoked_at IS NULL;

-- name: operator_key_list
SELECT id, prefix, label, role, created_at, revoked_at
FROM operator_keys
ORDER BY created_at, id;

-- name: operator_key_revoke
-- Revoke the active key with this id or display prefix, only when exactly one matches.
WITH matches AS (
    SELECT id FROM operator_keys
    WHERE (id::text = %(key)s OR prefix = %(key)s) AND revoked_at IS NULL
)
UPDATE operator_keys SET revoked_at = now()
WHERE id IN (SELECT id FROM matches) AND (SELECT count(*) FROM matches) = 1
RETURNING id, prefix, label, role, created_at, revoked_at;

-- name: operator_key_set_role
-- The role of the active key with this id or display prefix, only when exactly one matches;
-- its sessions read the new role at their next request (console_session_touch).
WITH matches AS (
    SELECT id FROM operator_keys
    WHERE (id::text = %(key)s OR prefix = %(key)s) AND revoked_at IS NULL
)
UPDATE operator_keys SET role = %(role)s
WHERE id IN (SELECT id FROM matches) AND (SELECT count(*) FROM matches) = 1
RETURNING id, prefix, label, role, created_at, revoked_at;
