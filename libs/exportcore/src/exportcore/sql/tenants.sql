-- Tenants: names, quota and submit-rate overrides.

-- name: tenant_upsert
INSERT INTO tenants (id, name) VALUES (%(tenant_id)s, %(name)s)
ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name
RETURNING *;

-- name: tenant_get
SELECT * FROM tenants WHERE id = %(tenant_id)s;

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

-- name: tenant_set_recipients
-- Set (or, with NULL, clear) the age recipients every export of the tenant is encrypted to
-- (exportcore.encryption; the worker reads them when it renders).
UPDATE tenants SET age_recipients = %(recipients)s::text[] WHERE id = %(tenant_id)s RETURNING *;
