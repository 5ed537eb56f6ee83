-- Admission control: the capacity and quota counters and the refusal ring, the front door
-- of every entry point.

-- name: admission_admit
-- The last statement before COMMIT of a transaction that wrote a new job: serialised check
-- of global capacity and tenant quota (raises SQLSTATE XEX01 / XEX02; O(1) on counters,
-- see migration 0008). job_submit calls it inside its own single statement.
SELECT exports_admit(%(tenant_id)s, %(capacity)s, %(default_quota)s);

-- name: admission_admit_many
-- admission_admit for `count` new jobs of one tenant at once (a bulk replay's batch,
-- migration 0016): one update of the global and of the tenant's counter row, the same
-- order and the same errors (SQLSTATE XEX01 / XEX02); the last statements before COMMIT.
SELECT exports_admit_many(%(tenant_id)s, %(count)s, %(capacity)s, %(default_quota)s);

-- name: admission_reconcile
-- The recovery-scanner's reconciliation of the admission counters (migration 0008) with the
-- rows: from ONE snapshot, the drift of each scope = (admitted - released) - active jobs,
-- subtracted as a delta, so admissions and releases committed meanwhile are kept. Scopes
-- are written global first ('*'), like exports_admit, so it never deadlocks with a submit.
-- Returns the scopes that drifted and by how much (positive: the counters said more).
WITH active AS (
    SELECT tenant_id AS scope, count(*) AS n
    FROM export_jobs
    WHERE status IN ('queued', 'running')
    GROUP BY tenant_id
), actual AS (
    SELECT scope, n FROM active
    UNION ALL
    SELECT '*', coalesce(sum(n), 0) FROM active
), released AS (
    SELECT scope, sum(released) AS n FROM export_admission_releases GROUP BY scope
), drift AS (
    SELECT coalesce(c.scope, a.scope) AS scope,
           coalesce(c.admitted, 0) - coalesce(r.n, 0) - coalesce(a.n, 0) AS drift
    FROM export_admission_counters c
    FULL JOIN actual a ON a.scope = c.scope
    LEFT JOIN released r ON r.scope = coalesce(c.scope, a.scope)
), fixed AS (
    INSERT INTO export_admission_counters AS c (scope, admitted)
    SELECT scope, -drift FROM drift WHERE drift <> 0
    ORDER BY scope <> '*', scope
    ON CONFLICT (scope) DO UPDATE SET admitted = c.admitted + EXCLUDED.admitted
    RETURNING scope
)
SELECT d.scope, d.drift::bigint AS drift
FROM drift d
WHERE d.drift <> 0
ORDER BY d.scope <> '*', d.scope;

-- name: admission_counters
-- Active jobs per scope as the counters say ('*' = global), for tests and operators.
SELECT c.scope, c.admitted - coalesce(sum(r.released), 0) AS active
FROM export_admission_counters c
LEFT JOIN export_admission_releases r ON r.scope = c.scope
GROUP BY c.scope, c.admitted
ORDER BY c.scope <> '*', c.scope;

-- name: admission_usage
-- Active jobs per tenant with each tenant's quota (for metrics and operators).
SELECT t.id AS tenant_id, coalesce(a.active, 0) AS active,
       coalesce(t.max_active_jobs, %(default_quota)s) AS quota
FROM tenants t
LEFT JOIN (
    SELECT tenant_id, count(*) AS active FROM export_jobs
    WHERE status IN ('queued', 'running') GROUP BY tenant_id
) a ON a.tenant_id = t.id
ORDER BY t.id;

-- name: admission_refusal_record
-- Count one refusal of the tenant in this minute's slot of its ring of 60 (migration 0011):
-- the slot's count restarts when it last held another minute. Its own statement, after the
-- refused transaction rolled back; a tenant that does not exist matches nothing.
INSERT INTO tenant_admission_refusals (tenant_id, code, slot, minute, refused)
SELECT t.id, %(code)s, extract(minute FROM now())::smallint, date_trunc('minute', now()), 1
FROM tenants t WHERE t.id = %(tenant_id)s
ON CONFLICT (tenant_id, code, slot) DO UPDATE
SET refused = CASE WHEN tenant_admission_refusals.minute = EXCLUDED.minute
                   THEN tenant_admission_refusals.refused + 1 ELSE 1 END,
    minute = EXCLUDED.minute
RETURNING refused;
