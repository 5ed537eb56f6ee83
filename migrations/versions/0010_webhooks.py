"""Signed completion webhooks: endpoints per tenant, their outbox of messages, the delivery
attempts, and the triggers that write a message in the transaction of the state change.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

UPGRADE = r"""
-- A tenant's receivers. The signing secret must be readable by the sender (HMAC is
-- symmetric), so it is stored as issued (whsec_<base64>); it is shown to the client once.
-- During a rotation's overlap the previous secret still signs (two signatures per message).
CREATE TABLE webhook_endpoints (
    id                          uuid PRIMARY KEY,
    tenant_id                   text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    url                         text NOT NULL CHECK (length(url) BETWEEN 8 AND 2048),
    description                 text NOT NULL DEFAULT '',
    events                      text[] NOT NULL CHECK (
        cardinality(events) > 0
        AND events <@ ARRAY['export.succeeded', 'export.failed', 'export.cancelled',
                            'schedule.paused']::text[]),
    enabled                     boolean NOT NULL DEFAULT true,
    secret                      text NOT NULL CHECK (secret LIKE 'whsec\_%'),
    previous_secret             text CHECK (previous_secret LIKE 'whsec\_%'),
    previous_secret_expires_at  timestamptz,
    -- health: the current run of failures, the circuit breaker, why it was disabled
    consecutive_failures        integer NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    failing_since               timestamptz,
    circuit_open_until          timestamptz,
    last_success_at             timestamptz,
    last_failure_at             timestamptz,
    last_error                  text,
    disabled_reason             text,
    disabled_at                 timestamptz,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_endpoints_previous_secret_pair
        CHECK ((previous_secret IS NULL) = (previous_secret_expires_at IS NULL))
);
CREATE INDEX webhook_endpoints_tenant_idx ON webhook_endpoints (tenant_id, created_at DESC, id DESC);
-- the triggers' lookup: a tenant's enabled endpoints (empty for most tenants: one probe)
CREATE INDEX webhook_endpoints_enabled_idx ON webhook_endpoints (tenant_id) WHERE enabled;

-- The webhook outbox: one message per (event, endpoint), written in the transaction of the
-- state change. Kept apart from export_outbox so that the two relays never interfere. The
-- message id is the Standard Webhooks `webhook-id` (msg_<hex>), the same on every attempt.
CREATE TABLE webhook_messages (
    id               uuid PRIMARY KEY,
    endpoint_id      uuid NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    tenant_id        text NOT NULL,
    event_type       text NOT NULL,
    subject_id       uuid NOT NULL,
    occurred_at      timestamptz NOT NULL,
    data             jsonb NOT NULL,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- attempts since the message was (re)queued, against WEBHOOK_MAX_ATTEMPTS
    budget_used      integer NOT NULL DEFAULT 0 CHECK (budget_used >= 0),
    redelivery       boolean NOT NULL DEFAULT false,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    claim_token      uuid,
    claimed_until    timestamptz,
    delivered_at     timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- the claim: an endpoint's due messages, and its claimed ones (the concurrency bound)
CREATE INDEX webhook_messages_due_idx ON webhook_messages (endpoint_id, next_attempt_at)
    WHERE status = 'pending';
-- the claimed (in flight) messages of an endpoint, counted against its concurrency bound:
-- a handful per endpoint however long the backlog is
CREATE INDEX webhook_messages_claimed_idx ON webhook_messages (endpoint_id)
    WHERE status = 'pending' AND claim_token IS NOT NULL;
-- backlog gauges and retention
CREATE INDEX webhook_messages_pending_idx ON webhook_messages (created_at) WHERE status = 'pending';
CREATE INDEX webhook_messages_done_idx ON webhook_messages (updated_at) WHERE status <> 'pending';

-- Every attempt: what was sent to which address and what came back.
CREATE TABLE webhook_attempts (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id   uuid NOT NULL REFERENCES webhook_messages (id) ON DELETE CASCADE,
    endpoint_id  uuid NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    attempt      integer NOT NULL,
    redelivery   boolean NOT NULL DEFAULT false,
    started_at   timestamptz NOT NULL,
    outcome      text NOT NULL CHECK (outcome IN (
        'delivered', 'http_error', 'redirect', 'gone', 'timeout', 'connection_error', 'refused')),
    status_code  integer,
    latency_ms   double precision,
    address      text,
    signatures   integer NOT NULL DEFAULT 1,
    error        text
);
CREATE INDEX webhook_attempts_endpoint_idx ON webhook_attempts (endpoint_id, id DESC);
CREATE INDEX webhook_attempts_message_idx ON webhook_attempts (message_id);

-- export_jobs: a terminal transition (whatever statement makes it: worker finish, recovery,
-- cancel, a batched rewrite of those) writes one message per subscribed enabled endpoint of
-- the tenant, in the same transaction, and wakes the delivery process. The WHEN clause is
-- evaluated without calling the function, so non-terminal updates (claim, renew) cost
-- nothing; a terminal one of a tenant without endpoints costs one index probe.
CREATE FUNCTION webhook_export_terminal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    event text := 'export.' || NEW.status;
BEGIN
    INSERT INTO webhook_messages (id, endpoint_id, tenant_id, event_type, subject_id, occurred_at, data)
    SELECT gen_random_uuid(), e.id, e.tenant_id, event, NEW.id, coalesce(NEW.finished_at, now()),
           jsonb_build_object('export', jsonb_build_object(
               'id', NEW.id,
               'status', NEW.status,
               'format', NEW.format,
               'note_count', NEW.note_count,
               'attempts', NEW.attempts,
               'replay_of', NEW.replay_of,
               'created_at', NEW.created_at,
               'finished_at', NEW.finished_at,
               'result', CASE WHEN NEW.status = 'succeeded' THEN jsonb_build_object(
                   'rows', NEW.result_rows, 'bytes', NEW.result_bytes,
                   'sha256', NEW.result_sha256) END,
               'error', CASE WHEN NEW.error_code IS NOT NULL THEN jsonb_build_object(
                   'code', NEW.error_code) END))
    FROM webhook_endpoints e
    WHERE e.tenant_id = NEW.tenant_id AND e.enabled AND event = ANY (e.events);
    IF FOUND THEN
        PERFORM pg_notify('webhook_messages', '');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER export_jobs_webhook_terminal AFTER UPDATE OF status ON export_jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION webhook_export_terminal();

-- export_schedules: enabled true -> false (a pause, by whatever statement) is schedule.paused.
CREATE FUNCTION webhook_schedule_paused() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_messages (id, endpoint_id, tenant_id, event_type, subject_id, occurred_at, data)
    SELECT gen_random_uuid(), e.id, e.tenant_id, 'schedule.paused', NEW.id, now(),
           jsonb_build_object('schedule', jsonb_build_object(
               'id', NEW.id,
               'enabled', NEW.enabled,
               'format', NEW.format,
               'next_due_at', NEW.next_due_at,
               'paused_at', now()))
    FROM webhook_endpoints e
    WHERE e.tenant_id = NEW.tenant_id AND e.enabled AND 'schedule.paused' = ANY (e.events);
    IF FOUND THEN
        PERFORM pg_notify('webhook_messages', '');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER export_schedules_webhook_paused AFTER UPDATE OF enabled ON export_schedules
    FOR EACH ROW
    WHEN (OLD.enabled AND NOT NEW.enabled)
    EXECUTE FUNCTION webhook_schedule_paused();
"""

DOWNGRADE = r"""
DROP TRIGGER IF EXISTS export_schedules_webhook_paused ON export_schedules;
DROP TRIGGER IF EXISTS export_jobs_webhook_terminal ON export_jobs;
DROP FUNCTION IF EXISTS webhook_schedule_paused();
DROP FUNCTION IF EXISTS webhook_export_terminal();
DROP TABLE IF EXISTS webhook_attempts;
DROP TABLE IF EXISTS webhook_messages;
DROP TABLE IF EXISTS webhook_endpoints;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
