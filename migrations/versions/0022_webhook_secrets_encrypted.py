"""Webhook signing secrets encrypted at rest (docs/webhooks.md "Encryption at rest").

``webhook_endpoints.secret`` / ``previous_secret`` held each endpoint's signing secret as
issued (``whsec_<base64>``): a database dump or backup let anyone sign webhooks. They are
replaced by ``secret_ciphertext`` / ``previous_secret_ciphertext``: the secret encrypted
with the deployment's current key (``WEBHOOK_SECRET_KEYS``, Fernet, see
:mod:`exportcore.webhooks.encryption`), each with the id of its key (``secret_key_id``,
``previous_secret_key_id``), and ``secret_hint`` (``whsec_ab12…``, what the API and the
CLI list) so that a listing needs no key.

The existing secrets are encrypted HERE, in the migration's transaction, with the key the
migration reads from the same settings chain as every process (``WEBHOOK_SECRET_KEYS`` in
its environment; the chart gives the migrations Job the same Secret): after this revision
no plaintext secret is left in the table, and CHECK constraints keep it so (a ciphertext
is a Fernet token, ``gAAAAA…``, never ``whsec_…``). With endpoints to encrypt and no key
the migration stops with a message that says so (nothing changed); without endpoints it
needs no key. The chosen alternative to a migration that needs a key would have been a
plaintext column left for the running processes to encrypt later: a window in which the
dump still holds secrets, and a schema that cannot say "never plaintext".

Offline (``alembic upgrade --sql``) the rows cannot be encrypted: the script emitted
refuses to run on a table that holds endpoints. The downgrade decrypts them back (it needs
the key as well).

Revision ID: 0022
Revises: 0020
Create Date: 2026-12-06
"""

from typing import Any

import sqlalchemy as sa
from alembic import context, op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

ADD_COLUMNS = r"""
ALTER TABLE webhook_endpoints
    ADD COLUMN secret_ciphertext text,
    ADD COLUMN secret_key_id text,
    ADD COLUMN previous_secret_ciphertext text,
    ADD COLUMN previous_secret_key_id text,
    ADD COLUMN secret_hint text;
"""

DROP_PLAINTEXT = r"""
ALTER TABLE webhook_endpoints
    DROP CONSTRAINT webhook_endpoints_previous_secret_pair,
    DROP COLUMN secret,
    DROP COLUMN previous_secret,
    ALTER COLUMN secret_ciphertext SET NOT NULL,
    ALTER COLUMN secret_key_id SET NOT NULL,
    ALTER COLUMN secret_hint SET NOT NULL,
    -- a Fernet token (version byte 0x80, then a 64-bit timestamp: 'gAAAAA' until 2106);
    -- a plaintext secret (whsec_...) can never be stored here
    ADD CONSTRAINT webhook_endpoints_secret_encrypted
        CHECK (secret_ciphertext LIKE 'gAAAAA%'
               AND (previous_secret_ciphertext IS NULL
                    OR previous_secret_ciphertext LIKE 'gAAAAA%')),
    ADD CONSTRAINT webhook_endpoints_secret_key_ids
        CHECK (secret_key_id ~ '^[0-9a-f]{8}$'
               AND (previous_secret_key_id IS NULL OR previous_secret_key_id ~ '^[0-9a-f]{8}$')),
    ADD CONSTRAINT webhook_endpoints_secret_hint
        CHECK (secret_hint LIKE 'whsec\_%' AND length(secret_hint) <= 12),
    ADD CONSTRAINT webhook_endpoints_previous_secret_pair
        CHECK ((previous_secret_ciphertext IS NULL) = (previous_secret_expires_at IS NULL)
               AND (previous_secret_ciphertext IS NULL) = (previous_secret_key_id IS NULL));
COMMENT ON COLUMN webhook_endpoints.secret_ciphertext IS
    'the signing secret encrypted with WEBHOOK_SECRET_KEYS (Fernet; never plaintext)';
COMMENT ON COLUMN webhook_endpoints.secret_key_id IS
    'id of the WEBHOOK_SECRET_KEYS key that encrypted secret_ciphertext';
COMMENT ON COLUMN webhook_endpoints.secret_hint IS
    'first characters of the current secret (whsec_ab12...), for listings';
"""

OFFLINE_GUARD = r"""
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM webhook_endpoints) THEN
        RAISE EXCEPTION 'webhook_endpoints holds signing secrets to encrypt: run this '
            'migration online (alembic upgrade, exportctl migrate) with WEBHOOK_SECRET_KEYS set';
    END IF;
END $$;
"""

RESTORE_PLAINTEXT_COLUMNS = r"""
ALTER TABLE webhook_endpoints
    ADD COLUMN secret text,
    ADD COLUMN previous_secret text;
"""

DROP_ENCRYPTED = r"""
ALTER TABLE webhook_endpoints
    DROP CONSTRAINT webhook_endpoints_previous_secret_pair,
    DROP COLUMN secret_ciphertext,
    DROP COLUMN secret_key_id,
    DROP COLUMN previous_secret_ciphertext,
    DROP COLUMN previous_secret_key_id,
    DROP COLUMN secret_hint,
    ALTER COLUMN secret SET NOT NULL,
    ADD CONSTRAINT webhook_endpoints_secret_check CHECK (secret LIKE 'whsec\_%'),
    ADD CONSTRAINT webhook_endpoints_previous_secret_check
        CHECK (previous_secret LIKE 'whsec\_%'),
    ADD CONSTRAINT webhook_endpoints_previous_secret_pair
        CHECK ((previous_secret IS NULL) = (previous_secret_expires_at IS NULL));
"""


def _box(count: int, doing: str) -> Any:
    """The deployment's SecretBox, or a RuntimeError saying why the migration needs it."""
    from exportcore.settings import Settings
    from exportcore.webhooks.encryption import ENV

    box = Settings().webhook_secret_box()
    if box is None:
        raise RuntimeError(
            f"webhook_endpoints holds {count} signing secret(s) to {doing} and {ENV} is not "
            f"set: set {ENV} (the same keys as the api and webhook-delivery; a new one: "
            "`exportctl webhook new-secret-key`) and run the migration again "
            '(docs/webhooks.md "Encryption at rest"); nothing was changed'
        )
    return box


def upgrade() -> None:
    if context.is_offline_mode():
        op.execute(OFFLINE_GUARD)
        op.execute(ADD_COLUMNS)
        op.execute(DROP_PLAINTEXT)
        return
    from exportcore.webhooks.signing import secret_hint

    bind = op.get_bind()
    rows = bind.execute(
        sa.text("SELECT id, secret, previous_secret FROM webhook_endpoints FOR UPDATE")
    ).fetchall()
    box = _box(len(rows), "encrypt") if rows else None
    op.execute(ADD_COLUMNS)
    for endpoint_id, secret, previous in rows:
        sealed = box.seal(secret)
        old = box.seal(previous) if previous else None
        bind.execute(
            sa.text(
                "UPDATE webhook_endpoints SET secret_ciphertext = :c, secret_key_id = :k, "
                "secret_hint = :h, previous_secret_ciphertext = :pc, "
                "previous_secret_key_id = :pk WHERE id = :id"
            ),
            {
                "c": sealed.ciphertext,
                "k": sealed.key_id,
                "h": secret_hint(secret),
                "pc": old.ciphertext if old else None,
                "pk": old.key_id if old else None,
                "id": endpoint_id,
            },
        )
    op.execute(DROP_PLAINTEXT)


def downgrade() -> None:
    if context.is_offline_mode():
        raise RuntimeError("the downgrade decrypts the secrets: run it online with the keys")
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT id, secret_ciphertext, secret_key_id, previous_secret_ciphertext, "
            "previous_secret_key_id FROM webhook_endpoints FOR UPDATE"
        )
    ).fetchall()
    box = _box(len(rows), "decrypt") if rows else None
    op.execute(RESTORE_PLAINTEXT_COLUMNS)
    for endpoint_id, ciphertext, kid, previous, previous_kid in rows:
        bind.execute(
            sa.text(
                "UPDATE webhook_endpoints SET secret = :s, previous_secret = :p WHERE id = :id"
            ),
            {
                "s": box.open(ciphertext, kid),
                "p": box.open(previous, previous_kid) if previous else None,
                "id": endpoint_id,
            },
        )
    op.execute(DROP_ENCRYPTED)
