"""Continuation records (API.md section 12): opaque provider state, encrypted at rest, apart from the
record it belongs to.

A continuation record is stored in journal.records like any other, with `"payload": null` and the
digest of the prefix it continues (`prefix_digest`, bound at append). Its payload lives here,
encrypted with AES-GCM under a key that is never in the database (JOURNAL_STATE_KEY_FILE): the row
holds the key's ID, the nonce and the ciphertext, whose associated data binds it to its tenant,
session, seq and prefix digest, so a payload moved to another row does not decrypt. Deleting the
session (or its records) takes the payloads with it; retention purges payloads past `expires_at`.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from effect_ledger.db.migrate import distribute_by_tenant, execute_script

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

PAYLOADS = r"""
CREATE TABLE journal.continuation_payloads (
    tenant_id  text        NOT NULL,
    session_id text        NOT NULL,
    seq        integer     NOT NULL CHECK (seq >= 1),
    key_id     text        NOT NULL CHECK (key_id ~ '^[A-Za-z0-9._-]{1,64}$'),
    nonce      bytea       NOT NULL CHECK (octet_length(nonce) = 12),
    ciphertext bytea       NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, session_id, seq),
    FOREIGN KEY (tenant_id, session_id, seq) REFERENCES journal.records (tenant_id, session_id, seq)
        ON DELETE CASCADE
);
-- Retention: payloads by expiry, across tenants.
CREATE INDEX continuation_payloads_expiry ON journal.continuation_payloads (expires_at);

ALTER TABLE journal.continuation_payloads ENABLE ROW LEVEL SECURITY;
ALTER TABLE journal.continuation_payloads FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON journal.continuation_payloads
    USING (tenant_id = current_setting('effect_ledger.tenant', true))
    WITH CHECK (tenant_id = current_setting('effect_ledger.tenant', true));
CREATE POLICY maintenance ON journal.continuation_payloads TO CURRENT_USER
    USING (current_setting('effect_ledger.maintenance', true) = 'on');
-- Inserted with their record and read by context replay; deleted only by cascade and retention.
GRANT SELECT, INSERT ON journal.continuation_payloads TO effect_ledger_runtime;
"""


def upgrade() -> None:
    """The encrypted payloads of continuation records."""
    execute_script(PAYLOADS)
    distribute_by_tenant("journal.continuation_payloads")


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
