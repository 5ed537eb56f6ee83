-- Webhook endpoints: a tenant's receivers (URL, events, signing secret) and their delivery
-- health, written by the api (management) and webhook-delivery (health). The signing
-- secrets are stored encrypted (exportcore.webhooks.encryption: ciphertext + key id),
-- never in plain text.

-- name: webhook_endpoint_insert
INSERT INTO webhook_endpoints (id, tenant_id, url, description, events, enabled,
                               secret_ciphertext, secret_key_id, secret_hint)
VALUES (%(endpoint_id)s, %(tenant_id)s, %(url)s, %(description)s, %(events)s, %(enabled)s,
        %(secret_ciphertext)s, %(secret_key_id)s, %(secret_hint)s)
RETURNING *;

-- name: webhook_endpoint_count_for_tenant
-- How many endpoints the tenant has (inside the create transaction, after locking the tenant).
SELECT count(*) AS n FROM webhook_endpoints WHERE tenant_id = %(tenant_id)s;

-- name: webhook_tenant_lock
-- Serialises endpoint creation per tenant so that the per-tenant limit holds.
SELECT id FROM tenants WHERE id = %(tenant_id)s FOR UPDATE;

-- name: webhook_endpoint_get_for_tenant
SELECT e.*,
       (SELECT count(*) FROM webhook_messages m
        WHERE m.endpoint_id = e.id AND m.status = 'pending') AS pending_messages
FROM webhook_endpoints e
WHERE e.id = %(endpoint_id)s AND e.tenant_id = %(tenant_id)s;

-- name: webhook_endpoint_lock_for_tenant
-- One endpoint of the tenant, locked until the transaction ends (an edit merges its patch
-- into the row as it is, and never overlaps the recording of an attempt).
SELECT * FROM webhook_endpoints
WHERE id = %(endpoint_id)s AND tenant_id = %(tenant_id)s
FOR UPDATE;

-- name: webhook_endpoint_list_for_tenant
SELECT e.*, NULL::bigint AS pending_messages
FROM webhook_endpoints e
WHERE e.tenant_id = %(tenant_id)s
ORDER BY e.created_at DESC, e.id DESC
LIMIT %(limit)s;

-- name: webhook_endpoint_update
-- Replace the editable fields (the caller merged the patch). Enabling a disabled endpoint
-- starts it afresh: failure run, circuit and disable reason cleared; its pending messages
-- are delivered again.
UPDATE webhook_endpoints
SET url = %(url)s,
    description = %(description)s,
    events = %(events)s,
    enabled = %(enabled)s,
    consecutive_failures = CASE WHEN %(enabled)s AND NOT enabled THEN 0 ELSE consecutive_failures END,
    failing_since = CASE WHEN %(enabled)s AND NOT enabled THEN NULL ELSE failing_since END,
    circuit_open_until = CASE WHEN %(enabled)s AND NOT enabled THEN NULL ELSE circuit_open_until END,
    disabled_reason = CASE
        WHEN %(enabled)s THEN NULL
        WHEN enabled THEN 'disabled by the client'
        ELSE disabled_reason END,
    disabled_at = CASE
        WHEN %(enabled)s THEN NULL
        WHEN enabled THEN now()
        ELSE disabled_at END,
    updated_at = now()
WHERE id = %(endpoint_id)s AND tenant_id = %(tenant_id)s
RETURNING *;

-- name: webhook_endpoint_delete
-- Delete an endpoint with its messages and attempts (waits for a delivery recording that
-- holds the row).
DELETE FROM webhook_endpoints WHERE id = %(endpoint_id)s AND tenant_id = %(tenant_id)s
RETURNING id;

-- name: webhook_endpoint_rotate_secret
-- A new current secret (encrypted); the old one keeps signing until now + overlap (0: at
-- once), its ciphertext kept with the id of the key that encrypted it. A rotation during
-- an overlap drops the secret before the old one.
UPDATE webhook_endpoints
SET previous_secret_ciphertext = CASE WHEN %(overlap_seconds)s > 0 THEN secret_ciphertext END,
    previous_secret_key_id = CASE WHEN %(overlap_seconds)s > 0 THEN secret_key_id END,
    previous_secret_expires_at = CASE WHEN %(overlap_seconds)s > 0
        THEN now() + make_interval(secs => %(overlap_seconds)s) END,
    secret_ciphertext = %(secret_ciphertext)s,
    secret_key_id = %(secret_key_id)s,
    secret_hint = %(secret_hint)s,
    updated_at = now()
WHERE id = %(endpoint_id)s AND tenant_id = %(tenant_id)s
RETURNING *;

-- name: webhook_endpoints_lock
-- The health of the endpoints whose attempts are being recorded, locked (in id order, so
-- two recorders never deadlock), with the database clock the policy judges by.
SELECT id, enabled, consecutive_failures, failing_since, circuit_open_until, disabled_reason,
       last_error, last_success_at, last_failure_at, now() AS now
FROM webhook_endpoints
WHERE id = ANY(%(ids)s::uuid[])
ORDER BY id
FOR UPDATE;

-- name: webhook_endpoints_set_health
-- Write the health the breaker policy decided, one row per endpoint.
UPDATE webhook_endpoints e
SET enabled = u.enabled,
    consecutive_failures = u.failures,
    failing_since = u.failing_since,
    circuit_open_until = u.open_until,
    disabled_reason = u.disabled_reason,
    disabled_at = CASE WHEN e.enabled AND NOT u.enabled THEN now() ELSE e.disabled_at END,
    last_error = u.last_error,
    last_success_at = u.last_success_at,
    last_failure_at = u.last_failure_at,
    updated_at = now()
FROM unnest(%(ids)s::uuid[], %(enabled)s::boolean[], %(failures)s::integer[],
            %(failing_since)s::timestamptz[], %(open_until)s::timestamptz[],
            %(disabled_reason)s::text[], %(last_error)s::text[],
            %(last_success_at)s::timestamptz[], %(last_failure_at)s::timestamptz[])
     AS u (id, enabled, failures, failing_since, open_until, disabled_reason, last_error,
           last_success_at, last_failure_at)
WHERE e.id = u.id
RETURNING e.id, e.enabled, e.disabled_reason, (e.disabled_at = now()) AS disabled_now;

-- name: webhook_endpoint_secret_key_census
-- How many stored secrets each key id encrypted (current secrets, and previous ones still
-- signing: an expired previous secret is never decrypted again). The processes check at
-- start that they hold every key listed; `exportctl webhook reencrypt-secrets` reports it.
SELECT k.key_id, count(*) AS secrets
FROM webhook_endpoints e
CROSS JOIN LATERAL (
    VALUES (e.secret_key_id),
           (CASE WHEN e.previous_secret_expires_at > now() THEN e.previous_secret_key_id END)
) AS k (key_id)
WHERE k.key_id IS NOT NULL
GROUP BY k.key_id
ORDER BY k.key_id;

-- name: webhook_endpoint_secrets_to_reencrypt
-- A batch of endpoints with a secret not encrypted with the current key, or with an
-- expired previous secret still stored (cleared by the re-encryption), locked; rows that
-- another transaction holds (an edit, a delivery being recorded) are left to the next
-- batch.
SELECT id, secret_ciphertext, secret_key_id, previous_secret_ciphertext,
       previous_secret_key_id, previous_secret_expires_at > now() AS previous_valid
FROM webhook_endpoints
WHERE secret_key_id <> %(current_key_id)s
   OR previous_secret_key_id <> %(current_key_id)s
   OR previous_secret_expires_at <= now()
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: webhook_endpoint_secrets_reencrypted
-- Store the re-encrypted secrets of a batch (a NULL previous ciphertext: none, or expired
-- and dropped; its expiry goes with it).
UPDATE webhook_endpoints e
SET secret_ciphertext = u.ciphertext,
    secret_key_id = u.key_id,
    previous_secret_ciphertext = u.previous_ciphertext,
    previous_secret_key_id = u.previous_key_id,
    previous_secret_expires_at = CASE WHEN u.previous_ciphertext IS NULL THEN NULL
                                      ELSE e.previous_secret_expires_at END
FROM unnest(%(ids)s::uuid[], %(ciphertexts)s::text[], %(key_ids)s::text[],
            %(previous_ciphertexts)s::text[], %(previous_key_ids)s::text[])
     AS u (id, ciphertext, key_id, previous_ciphertext, previous_key_id)
WHERE e.id = u.id;
