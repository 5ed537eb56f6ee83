"""Metadata and tags of exports and schedules: an index that finds them, and webhooks that
carry them (docs/api.md "Metadata and tags").

A client's ``metadata`` and ``tags`` are part of its request, so they live where the request
does: the ``labels`` member of the canonical ``payload`` (``export_jobs.payload`` and
``export_schedules.payload``, both jsonb, ``{"metadata": {...}, "tags": [...]}``), hashed
with it for the Idempotency-Key and copied with it by replays and by a schedule's slots.
No column is added, and the submit statements are unchanged.

- ``export_jobs_labels_idx``: GIN (``jsonb_path_ops``) on ``payload -> 'labels'``, partial
  ``WHERE payload ? 'labels'``. It serves every label filter (``GET /v1/exports?tag=…&
  metadata[key]=…``, the console's jobs filter, bulk actions) as ONE containment
  ``payload -> 'labels' @> '{"tags": ["a"], "metadata": {"k": "v"}}'``. An export without
  metadata or tags has no ``labels`` member: the predicate is false, so it writes no index
  entry and no WAL for it on the submit path. ``jsonb_path_ops`` (hashes of whole paths)
  is smaller than the default opclass and supports exactly ``@>``.
- ``webhook_export_terminal()`` again (migration 0010), with ``metadata`` ({} when none) and
  ``tags`` ([] when none) in the export of every ``export.*`` payload. The labels are read
  from the payload only for a tenant with a subscribed endpoint (the expression belongs to
  the INSERT's rows).

The downgrade drops the index and restores the function of 0010; metadata and tags stay
in the payloads (older code ignores the member).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_FUNCTION = r"""
CREATE OR REPLACE FUNCTION webhook_export_terminal() RETURNS trigger LANGUAGE plpgsql AS $$
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
                   'code', NEW.error_code) END{labels}))
    FROM webhook_endpoints e
    WHERE e.tenant_id = NEW.tenant_id AND e.enabled AND event = ANY (e.events);
    IF FOUND THEN
        PERFORM pg_notify('webhook_messages', '');
    END IF;
    RETURN NULL;
END $$;
"""

_LABELS = """,
               'metadata', coalesce(NEW.payload -> 'labels' -> 'metadata', '{}'::jsonb),
               'tags', coalesce(NEW.payload -> 'labels' -> 'tags', '[]'::jsonb)"""

UPGRADE = r"""
CREATE INDEX export_jobs_labels_idx
    ON export_jobs USING gin ((payload -> 'labels') jsonb_path_ops)
    WHERE payload ? 'labels';
""" + _FUNCTION.replace("{labels}", _LABELS)

DOWNGRADE = r"""
DROP INDEX IF EXISTS export_jobs_labels_idx;
""" + _FUNCTION.replace("{labels}", "")


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
