-- Dispatch pauses (migration 0024): an operator stops dispatch of a queue (`tenant_id`
-- NULL) or of one tenant on a queue. The fair claim (outbox.sql
-- outbox_mark_sent_and_claim_due) reads this table once per statement and leaves the
-- pending events of a paused (tenant, queue) pair where they are; running exports finish.
-- Each change is audited in its own transaction (exportcore.pauses).

-- name: dispatch_pause_insert
-- Pause a scope; no row back when it is paused already (one pause per scope: the unique
-- index dispatch_pauses_scope, NULLS NOT DISTINCT).
INSERT INTO dispatch_pauses (queue, tenant_id, reason, paused_by)
VALUES (%(queue)s, %(tenant_id)s, %(reason)s, %(paused_by)s)
ON CONFLICT (queue, tenant_id) DO NOTHING
RETURNING queue, tenant_id, reason, paused_by, paused_at;

-- name: dispatch_pause_delete
-- Resume a scope: the pause row goes, and the publishers are woken at COMMIT (NOTIFY
-- export_outbox with the queue, as a submit does) so the waiting events go out at once.
-- No row back when the scope was not paused.
WITH gone AS (
    DELETE FROM dispatch_pauses
    WHERE queue = %(queue)s AND tenant_id IS NOT DISTINCT FROM %(tenant_id)s
    RETURNING queue, tenant_id, reason, paused_by, paused_at
)
SELECT gone.queue, gone.tenant_id, gone.reason, gone.paused_by, gone.paused_at,
       now() AS resumed_at, pg_notify('export_outbox', gone.queue)::text AS notified
FROM gone;

-- name: dispatch_pause_get
-- The pause in force on exactly this scope (a queue-wide pause is tenant_id NULL).
SELECT queue, tenant_id, reason, paused_by, paused_at
FROM dispatch_pauses
WHERE queue = %(queue)s AND tenant_id IS NOT DISTINCT FROM %(tenant_id)s;

-- name: dispatch_pauses_list
-- Every pause in force, queue-wide ones first, with how long it has lasted and the pending
-- outbox events waiting behind it (one probe of export_outbox_tenant_pending_idx per pause:
-- pauses are few).
SELECT p.queue, p.tenant_id, p.reason, p.paused_by, p.paused_at,
       extract(epoch FROM now() - p.paused_at)::float8 AS paused_seconds,
       (SELECT count(*) FROM export_outbox o
        WHERE o.sent_at IS NULL AND o.queue = p.queue
          AND (p.tenant_id IS NULL OR o.tenant_id = p.tenant_id))::int AS waiting
FROM dispatch_pauses p
ORDER BY p.queue, p.tenant_id NULLS FIRST;

-- name: dispatch_pause_covers
-- Whether a pause holds this tenant's work on this queue (its own pause or the queue's):
-- what an export's status says while it is queued.
SELECT EXISTS (SELECT 1 FROM dispatch_pauses p
               WHERE p.queue = %(queue)s
                 AND (p.tenant_id IS NULL OR p.tenant_id = %(tenant_id)s)) AS paused;
