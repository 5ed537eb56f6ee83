"""Snapshots by reference: a job's items name note versions; superseded versions are kept.

- ``note_versions``: an immutable copy of every note version that was superseded (the row
  as it was before an UPDATE that changed its version, or before a DELETE), written by the
  note triggers in the writer's own transaction: ``notes_track_change`` (BEFORE UPDATE,
  per row, when the version moves) and ``notes_write_tombstone`` (AFTER DELETE, per
  statement). ``superseded_xid`` is the writer's transaction. The copy is unconditional on
  purpose: a submit that has read version v but not committed yet is invisible to the note
  writer, so "copy only if something references v" would lose v (docs/architecture.md
  INV-18 snapshot-by-reference). The recovery-scanner prunes what no job may still render.
- ``notes_continue_version`` (BEFORE INSERT) and ``notes_check_version`` (AFTER INSERT): a
  note id written again after a delete continues its old version sequence (its tombstone's
  version + 1), so that (note id, version) always names one text.
- ``export_job_items`` keeps only the reference: ``note_id``, ``version``, ``deleted`` and,
  for a tombstone, ``deleted_at`` (the old ``updated_at`` renamed; NULL for a note). The
  text columns go: before they go, the text of every item whose note is no longer at that
  version (or gone) moves into ``note_versions``.
- ``exports_item_note(note_id, version, deleted)``: an item's note at its version, from
  ``notes`` or else ``note_versions`` (the render's read, inlined into jobs.sql).

The downgrade puts the text columns back from the current notes and ``note_versions``; an
item whose version was already pruned belonged to a job that can never render again (it
was succeeded or cancelled, docs/architecture.md) and gets empty text.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE note_versions (
    note_id         bigint NOT NULL,
    version         bigint NOT NULL,
    tenant_id       text NOT NULL,
    title           text NOT NULL,
    content         text NOT NULL,
    pinned          boolean NOT NULL,
    updated_at      timestamptz NOT NULL,
    superseded_xid  xid8 NOT NULL DEFAULT pg_current_xact_id(),
    superseded_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (note_id, version)
);
COMMENT ON TABLE note_versions IS
    'superseded note versions, kept while a job may render them (docs/architecture.md INV-18)';
CREATE TRIGGER note_versions_immutable BEFORE UPDATE ON note_versions
    FOR EACH ROW EXECUTE FUNCTION exports_forbid_update();

CREATE OR REPLACE FUNCTION notes_track_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.title, NEW.content, NEW.pinned, NEW.updated_at)
       IS DISTINCT FROM (OLD.title, OLD.content, OLD.pinned, OLD.updated_at) THEN
        NEW.version := OLD.version + 1;
        NEW.changed_xid := pg_current_xact_id();
        -- the version this update supersedes, for every snapshot that may still name it
        INSERT INTO note_versions (note_id, version, tenant_id, title, content, pinned, updated_at)
        VALUES (OLD.id, OLD.version, OLD.tenant_id, OLD.title, OLD.content, OLD.pinned,
                OLD.updated_at);
    ELSE
        NEW.version := OLD.version;
        NEW.changed_xid := OLD.changed_xid;
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION notes_write_tombstone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO note_versions (note_id, version, tenant_id, title, content, pinned, updated_at)
    SELECT o.id, o.version, o.tenant_id, o.title, o.content, o.pinned, o.updated_at
    FROM old_notes o;
    INSERT INTO note_tombstones (note_id, tenant_id, version)
    SELECT o.id, o.tenant_id, o.version + 1 FROM old_notes o
    ON CONFLICT (note_id) DO UPDATE
    SET version = EXCLUDED.version, deleted_at = now(), deleted_xid = pg_current_xact_id();
    RETURN NULL;
END $$;

-- A note id inserted again after a delete continues after its tombstone's version.
CREATE FUNCTION notes_continue_version() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    gone bigint;
BEGIN
    SELECT t.version INTO gone FROM note_tombstones t WHERE t.note_id = NEW.id;
    IF gone IS NOT NULL AND NEW.version <= gone THEN
        NEW.version := gone + 1;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER notes_continue_version BEFORE INSERT ON notes
    FOR EACH ROW EXECUTE FUNCTION notes_continue_version();

-- The BEFORE trigger read the tombstones before the primary key's check, which may have
-- waited for a concurrent delete of the same id: checked again after it (a READ COMMITTED
-- function's query sees what committed meanwhile). A clash is a serialization failure:
-- the writer retries and continues the sequence.
CREATE FUNCTION notes_check_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM note_tombstones t
               WHERE t.note_id = NEW.id AND t.version >= NEW.version) THEN
        RAISE EXCEPTION 'note % was deleted while it was inserted again; retry', NEW.id
            USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER notes_check_version AFTER INSERT ON notes
    FOR EACH ROW EXECUTE FUNCTION notes_check_version();

-- Existing snapshots: the text of every item whose note is no longer at that version (or
-- gone) moves into the version store (the newest job's copy when several jobs hold one).
INSERT INTO note_versions (note_id, version, tenant_id, title, content, pinned, updated_at)
SELECT DISTINCT ON (i.note_id, i.version)
       i.note_id, i.version, j.tenant_id, i.title, i.content, i.pinned, i.updated_at
FROM export_job_items i
JOIN export_jobs j ON j.id = i.job_id
WHERE NOT i.deleted
  AND NOT EXISTS (SELECT 1 FROM notes n WHERE n.id = i.note_id AND n.version = i.version)
ORDER BY i.note_id, i.version, j.created_at DESC;

ALTER TABLE export_job_items RENAME COLUMN updated_at TO deleted_at;
ALTER TABLE export_job_items ALTER COLUMN deleted_at DROP NOT NULL;
ALTER TABLE export_job_items DISABLE TRIGGER export_job_items_immutable;
UPDATE export_job_items SET deleted_at = NULL WHERE NOT deleted;
ALTER TABLE export_job_items ENABLE TRIGGER export_job_items_immutable;
ALTER TABLE export_job_items
    DROP COLUMN title,
    DROP COLUMN content,
    DROP COLUMN pinned,
    ALTER COLUMN version DROP DEFAULT,
    ADD CONSTRAINT export_job_items_tombstone_dated CHECK (deleted = (deleted_at IS NOT NULL));

-- The text of note `p_note_id` at `p_version` (docs/architecture.md INV-18): the current
-- note when it is still at that version, else the version store's copy, each by primary
-- key; the version store is probed only when the note is not at that version (the LIMIT
-- stops the UNION at its first row). No row for a tombstone (`p_deleted`) or for a version
-- kept nowhere. LANGUAGE sql, STABLE, not STRICT, a set: inlined into the calling
-- statement (the render's reads in jobs.sql) as a subquery.
CREATE FUNCTION exports_item_note(p_note_id bigint, p_version bigint, p_deleted boolean)
RETURNS TABLE (title text, content text, pinned boolean, updated_at timestamptz)
LANGUAGE sql STABLE AS $$
    (SELECT n.title, n.content, n.pinned, n.updated_at
     FROM notes n
     WHERE n.id = p_note_id AND n.version = p_version AND NOT p_deleted
     UNION ALL
     SELECT v.title, v.content, v.pinned, v.updated_at
     FROM note_versions v
     WHERE v.note_id = p_note_id AND v.version = p_version AND NOT p_deleted)
    LIMIT 1
$$;
"""

DOWNGRADE = r"""
DROP FUNCTION IF EXISTS exports_item_note(bigint, bigint, boolean);
ALTER TABLE export_job_items
    DROP CONSTRAINT IF EXISTS export_job_items_tombstone_dated,
    ALTER COLUMN version SET DEFAULT 1,
    ADD COLUMN title text,
    ADD COLUMN content text,
    ADD COLUMN pinned boolean;
ALTER TABLE export_job_items DISABLE TRIGGER export_job_items_immutable;
UPDATE export_job_items i
SET title = coalesce(n.title, v.title, ''),
    content = coalesce(n.content, v.content, ''),
    pinned = coalesce(n.pinned, v.pinned, false),
    deleted_at = coalesce(n.updated_at, v.updated_at, now())
FROM export_job_items x
LEFT JOIN notes n ON n.id = x.note_id AND n.version = x.version
LEFT JOIN note_versions v ON v.note_id = x.note_id AND v.version = x.version
WHERE NOT i.deleted AND x.job_id = i.job_id AND x.ordinal = i.ordinal;
UPDATE export_job_items SET title = '', content = '', pinned = false WHERE deleted;
ALTER TABLE export_job_items ENABLE TRIGGER export_job_items_immutable;
ALTER TABLE export_job_items RENAME COLUMN deleted_at TO updated_at;
ALTER TABLE export_job_items
    ALTER COLUMN title SET NOT NULL,
    ALTER COLUMN content SET NOT NULL,
    ALTER COLUMN pinned SET NOT NULL,
    ALTER COLUMN updated_at SET NOT NULL;

DROP TRIGGER IF EXISTS notes_check_version ON notes;
DROP FUNCTION IF EXISTS notes_check_version();
DROP TRIGGER IF EXISTS notes_continue_version ON notes;
DROP FUNCTION IF EXISTS notes_continue_version();

CREATE OR REPLACE FUNCTION notes_track_change() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE OR REPLACE FUNCTION notes_write_tombstone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO note_tombstones (note_id, tenant_id, version)
    SELECT o.id, o.tenant_id, o.version + 1 FROM old_notes o
    ON CONFLICT (note_id) DO UPDATE
    SET version = EXCLUDED.version, deleted_at = now(), deleted_xid = pg_current_xact_id();
    RETURN NULL;
END $$;

DROP TABLE IF EXISTS note_versions;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
