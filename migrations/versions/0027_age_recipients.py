"""Exports only the client can read: age recipients of a tenant, signed envelopes.

- ``tenants.age_recipients`` (``text[]``, NULL: none): the age X25519 recipients
  (``age1…``, public keys) every export of the tenant is encrypted to, set by operators
  (``exportctl tenant set-recipients``). A request may name more (``recipients`` of
  ``POST /v1/exports``, kept in the job's ``payload``); the worker encrypts to both
  (docs/api.md "Encrypted exports"). A CHECK keeps the column to the shape of a recipient
  (the library checks the key itself before anything is stored).
- ``export_envelopes``: the signed envelope of an encrypted artifact (the ciphertext's
  SHA-256 and size, the recipients, the inner manifest's identity), one per job, recorded
  by the lease holder in the finish's transaction under its lease token like
  ``export_manifests``; removed with its job.

The downgrade drops both (encrypted artifacts already written stay encrypted; their
envelopes are gone, so ``exportctl verify`` can then check them only with the key).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07
"""

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE tenants ADD COLUMN age_recipients text[]
    CONSTRAINT tenants_age_recipients_shape CHECK (
        age_recipients IS NULL
        OR (cardinality(age_recipients) BETWEEN 1 AND 16
            AND array_to_string(age_recipients, ',') ~ '^age1[02-9ac-hj-np-z]{58}(,age1[02-9ac-hj-np-z]{58})*$')
    );

CREATE TABLE export_envelopes (
    job_id      uuid PRIMARY KEY REFERENCES export_jobs (id) ON DELETE CASCADE,
    lease_token uuid NOT NULL,
    header      jsonb NOT NULL,
    signature   jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);
"""

DOWNGRADE = r"""
DROP TABLE export_envelopes;
ALTER TABLE tenants DROP COLUMN age_recipients;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
