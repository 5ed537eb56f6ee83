-- Idempotency keys (IETF draft "The Idempotency-Key HTTP Header Field"): one row per
-- (tenant, key), reserved in the submit's transaction and kept for IDEMPOTENCY_RETENTION.

-- name: idempotency_key_reserve
-- Reserve (tenant, key) for a new job, or take over an expired key. A concurrent request
-- with the same key waits here until the first one commits or rolls back. No row back
-- means a live key already exists (see idempotency_key_get).
INSERT INTO export_idempotency_keys (tenant_id, key, request_hash, job_id, expires_at)
VALUES (%(tenant_id)s, %(key)s, %(request_hash)s, %(job_id)s,
        now() + make_interval(secs => %(retention_seconds)s))
ON CONFLICT (tenant_id, key) DO UPDATE
SET request_hash = EXCLUDED.request_hash,
    job_id = EXCLUDED.job_id,
    created_at = now(),
    expires_at = EXCLUDED.expires_at
WHERE export_idempotency_keys.expires_at <= now()
RETURNING job_id;

-- name: idempotency_key_get
SELECT tenant_id, key, request_hash, job_id, created_at, expires_at
FROM export_idempotency_keys
WHERE tenant_id = %(tenant_id)s AND key = %(key)s;

-- name: idempotency_key_delete_expired
-- Expired keys (they may be reused anyway; this only bounds the table).
DELETE FROM export_idempotency_keys
WHERE ctid IN (SELECT ctid FROM export_idempotency_keys WHERE expires_at <= now() LIMIT %(limit)s);
