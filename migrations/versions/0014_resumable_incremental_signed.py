"""Resumable bulk exports, incremental exports with tombstones, signed manifests.

- ``export_checkpoints``: one row per bulk job whose render has made a prefix of its artifact
  durable: the keyset cursor (``ordinal``), the notes and bytes of that prefix, its SHA-256,
  the key whose unfinished write holds it (a temporary file, or an S3 multipart upload with
  the parts' ETags), and the lease token that owns the row. Written and taken over only under
  the job's current lease token (docs/architecture.md "Checkpoints").
- ``export_checkpoint_segments``: the renderer state each checkpoint added (manifest entries,
  zip entries), compressed, so a takeover rebuilds the renderer without rendering again.
- ``notes.version`` / ``notes.changed_xid``: a version counter and the transaction that last
  wrote the note (triggers keep both), and ``note_tombstones``: one row per deleted note id
  (written by a trigger on DELETE, so every path that removes a note leaves one).
- ``export_jobs.snapshot``: the ``pg_snapshot`` the submit read the notes in; a delta selects
  what that snapshot did not see. ``base_job_id`` / ``base_manifest_sha256`` name a delta's
  base; ``selects_all`` (generated from the payload): an export of every note, the only kind
  that can be a base; ``export_job_items.version`` / ``deleted`` carry versions and tombstones.
- ``export_manifests``: the signed manifest of a rendered artifact, recorded under the lease
  token that wrote it (a delta's base must have one for the base's winning token).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE export_checkpoints (
    job_id          uuid PRIMARY KEY REFERENCES export_jobs (id) ON DELETE CASCADE,
    lease_token     uuid NOT NULL,
    layout          integer NOT NULL,
    artifact_key    text NOT NULL,
    ordinal         integer NOT NULL CHECK (ordinal >= 0),
    rows            integer NOT NULL CHECK (rows >= 0),
    bytes           bigint NOT NULL CHECK (bytes >= 0),
    sha256          text NOT NULL,
    upload_id       text,
    parts           jsonb NOT NULL DEFAULT '[]',
    renderer        jsonb NOT NULL DEFAULT '{}',
    resumes         integer NOT NULL DEFAULT 0,
    carried_rows    integer NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE export_checkpoints IS
    'the durable prefix of a bulk render, owned by lease_token (docs/architecture.md Checkpoints)';

CREATE TABLE export_checkpoint_segments (
    job_id   uuid NOT NULL REFERENCES export_jobs (id) ON DELETE CASCADE,
    ordinal  integer NOT NULL,
    state    bytea NOT NULL,
    PRIMARY KEY (job_id, ordinal)
);

ALTER TABLE notes
    ADD COLUMN version bigint NOT NULL DEFAULT 1,
    ADD COLUMN changed_xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX notes_tenant_changed_idx ON notes (tenant_id, changed_xid);

CREATE TABLE note_tombstones (
    note_id      bigint PRIMARY KEY,
    tenant_id    text NOT NULL,
    version      bigint NOT NULL,
    deleted_at   timestamptz NOT NULL DEFAULT now(),
    deleted_xid  xid8 NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX note_tombstones_tenant_xid_idx ON note_tombstones (tenant_id, deleted_xid);

CREATE FUNCTION notes_track_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.title, NEW.content, NEW.pinned, NEW.updated_at)
       IS DISTINCT FROM (OLD.title, OLD.content, OLD.pinned, OLD.updated_at) THEN
        NEW.version := OLD.version + 1;
        NEW.changed_xid := pg_current_xact_id();
    ELSE
        NEW.version := OLD.version;
        NEW.changed_xid := OLD.changed_xid;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER notes_track_change BEFORE UPDATE ON notes
    FOR EACH ROW EXECUTE FUNCTION notes_track_change();

CREATE FUNCTION notes_write_tombstone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO note_tombstones (note_id, tenant_id, version)
    SELECT o.id, o.tenant_id, o.version + 1 FROM old_notes o
    ON CONFLICT (note_id) DO UPDATE
    SET version = EXCLUDED.version, deleted_at = now(), deleted_xid = pg_current_xact_id();
    RETURN NULL;
END $$;
CREATE TRIGGER notes_write_tombstone AFTER DELETE ON notes
    REFERENCING OLD TABLE AS old_notes
    FOR EACH STATEMENT EXECUTE FUNCTION notes_write_tombstone();

ALTER TABLE export_jobs
    ADD COLUMN snapshot pg_snapshot,
    ADD COLUMN base_job_id uuid REFERENCES export_jobs (id) ON DELETE SET NULL,
    ADD COLUMN base_manifest_sha256 text,
    ADD COLUMN selects_all boolean
        GENERATED ALWAYS AS (coalesce((payload -> 'selection') ? 'all', false)) STORED;
CREATE INDEX export_jobs_base_idx ON export_jobs (base_job_id) WHERE base_job_id IS NOT NULL;

ALTER TABLE export_job_items
    ADD COLUMN version bigint NOT NULL DEFAULT 1,
    ADD COLUMN deleted boolean NOT NULL DEFAULT false;

CREATE TABLE export_manifests (
    job_id        uuid PRIMARY KEY REFERENCES export_jobs (id) ON DELETE CASCADE,
    lease_token   uuid NOT NULL,
    sha256        text NOT NULL,
    key_id        text,
    notes         integer NOT NULL,
    tombstones    integer NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
"""

DOWNGRADE = r"""
DROP TABLE IF EXISTS export_manifests;
ALTER TABLE export_job_items DROP COLUMN IF EXISTS deleted, DROP COLUMN IF EXISTS version;
DROP INDEX IF EXISTS export_jobs_base_idx;
ALTER TABLE export_jobs
    DROP COLUMN IF EXISTS selects_all,
    DROP COLUMN IF EXISTS base_manifest_sha256,
    DROP COLUMN IF EXISTS base_job_id,
    DROP COLUMN IF EXISTS snapshot;
DROP TRIGGER IF EXISTS notes_write_tombstone ON notes;
DROP FUNCTION IF EXISTS notes_write_tombstone();
DROP TRIGGER IF EXISTS notes_track_change ON notes;
DROP FUNCTION IF EXISTS notes_track_change();
DROP TABLE IF EXISTS note_tombstones;
DROP INDEX IF EXISTS notes_tenant_changed_idx;
ALTER TABLE notes DROP COLUMN IF EXISTS changed_xid, DROP COLUMN IF EXISTS version;
DROP TABLE IF EXISTS export_checkpoint_segments;
DROP TABLE IF EXISTS export_checkpoints;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
