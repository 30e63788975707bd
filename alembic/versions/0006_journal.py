"""The run journal (API.md section 12): owned sessions and their ordered records.

Sessions carry the owner (tenant and principal), the revision (the number of accepted records), the
labels, the replay key of the batch that produced the current revision, and `causal`: the compact
causal index (call_id -> name, call seq, result seq) that an append checks its batch against without
reading the records back. Records are the accepted JSON records, numbered by seq. Both are keyed by
tenant first, isolated by forced row-level security like the ledger's tables, readable across tenants
only by the owner's maintenance scope (0002's pattern), and distributed by tenant_id and co-located
with ledger.operations on Citus (0003's pattern), so an append and a projection's ledger lookup stay
single-shard.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from effect_ledger.db.migrate import distribute_by_tenant, execute_script

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

JOURNAL = r"""
CREATE SCHEMA journal;
REVOKE ALL ON SCHEMA journal FROM PUBLIC;

CREATE TABLE journal.sessions (
    tenant_id          text        NOT NULL,
    session_id         text        NOT NULL CHECK (session_id ~ '^ses_[A-Za-z0-9_-]{22,64}$'),
    principal          text        NOT NULL,
    revision           integer     NOT NULL DEFAULT 0 CHECK (revision >= 0),
    schema             integer     NOT NULL DEFAULT 1 CHECK (schema >= 1),
    labels             jsonb       NOT NULL DEFAULT '{}',
    causal             jsonb       NOT NULL DEFAULT '{}',
    -- the batch that produced the current revision: its client_nonce (hashed), its base revision
    -- and its digest, so that a retried append whose answer was lost is answered, not stored twice
    last_nonce_hash    bytea,
    last_base_revision integer,
    last_batch_digest  text,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, session_id)
);
-- Retention: idle sessions by last change, across tenants.
CREATE INDEX sessions_idle ON journal.sessions (updated_at);

CREATE TABLE journal.records (
    tenant_id   text        NOT NULL,
    session_id  text        NOT NULL,
    seq         integer     NOT NULL CHECK (seq >= 1),
    record      jsonb       NOT NULL,
    schema      integer     NOT NULL CHECK (schema >= 1),
    -- UTF-8 bytes of the record's JCS form, measured once at append (caps and context budgets)
    jcs_bytes   integer     NOT NULL CHECK (jcs_bytes >= 2),
    accepted_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, session_id, seq),
    -- deleting a session (DELETE or retention) takes its records with it in the same statement
    FOREIGN KEY (tenant_id, session_id) REFERENCES journal.sessions (tenant_id, session_id)
        ON DELETE CASCADE
);

ALTER TABLE journal.sessions ENABLE ROW LEVEL SECURITY;
ALTER TABLE journal.sessions FORCE ROW LEVEL SECURITY;
ALTER TABLE journal.records ENABLE ROW LEVEL SECURITY;
ALTER TABLE journal.records FORCE ROW LEVEL SECURITY;
-- No tenant set means current_setting(..., true) is NULL or '', which matches no row.
CREATE POLICY tenant_isolation ON journal.sessions
    USING (tenant_id = current_setting('effect_ledger.tenant', true))
    WITH CHECK (tenant_id = current_setting('effect_ledger.tenant', true));
CREATE POLICY tenant_isolation ON journal.records
    USING (tenant_id = current_setting('effect_ledger.tenant', true))
    WITH CHECK (tenant_id = current_setting('effect_ledger.tenant', true));
-- Retention runs as the owner across tenants, only in a transaction that asks for it (see 0002).
CREATE POLICY maintenance ON journal.sessions TO CURRENT_USER
    USING (current_setting('effect_ledger.maintenance', true) = 'on');
CREATE POLICY maintenance ON journal.records TO CURRENT_USER
    USING (current_setting('effect_ledger.maintenance', true) = 'on');

-- The runtime role creates, advances, reads and deletes sessions; records are only ever inserted
-- and read (a session's DELETE cascades to them under the owner's rights).
GRANT USAGE ON SCHEMA journal TO effect_ledger_runtime;
GRANT SELECT, INSERT, UPDATE, DELETE ON journal.sessions TO effect_ledger_runtime;
GRANT SELECT, INSERT ON journal.records TO effect_ledger_runtime;
"""


def upgrade() -> None:
    """Create the journal schema: sessions, records, row-level security, grants, Citus distribution."""
    execute_script(JOURNAL)
    # Citus: by tenant_id, co-located with ledger.operations, parents first; nothing on plain PostgreSQL.
    distribute_by_tenant("journal.sessions", "journal.records")


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
