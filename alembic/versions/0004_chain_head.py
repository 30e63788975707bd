"""Keep each operation's chain head (last event seq and hash) on its row.

A transition then locks and reads the operation, head included, in one statement: FOR UPDATE returns
the newest row version after waiting, and every event append now updates the row in the same
transaction, so the head it carries is always current. One round trip less per transition.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from effect_ledger.db.migrate import execute_script

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Columns first, then their checks under explicit names (the names PostgreSQL would have chosen): Citus
# refuses ADD COLUMN with an unnamed constraint (every constraint it copies to the shards must be named),
# refuses ADD CONSTRAINT beside other subcommands, and forwards ADD CONSTRAINT to the workers with the
# text it was given, so each check is its own script (see docs/citus.md, "Writing a migration").
COLUMNS = r"""
ALTER TABLE ledger.operations
    ADD COLUMN chain_seq integer NOT NULL DEFAULT 0,
    ADD COLUMN chain_hash text NOT NULL DEFAULT repeat('0', 64);
"""
CHECKS = (
    "ALTER TABLE ledger.operations ADD CONSTRAINT operations_chain_seq_check CHECK (chain_seq >= 0)",
    "ALTER TABLE ledger.operations"
    " ADD CONSTRAINT operations_chain_hash_check CHECK (chain_hash ~ '^[0-9a-f]{64}$')",
)

# Backfill across tenants: the migration login's maintenance policy (0002) needs this switch when it is
# not a superuser (a superuser bypasses row-level security anyway). SET LOCAL, not set_config(), so that
# Citus forwards it to the workers' shards; alone in its script, because Citus forwards it as written.
BACKFILL = (
    "SET LOCAL effect_ledger.maintenance = 'on'",
    r"""
UPDATE ledger.operations AS o
SET chain_seq = head.seq, chain_hash = head.hash
FROM (
    SELECT DISTINCT ON (tenant_id, operation_id) tenant_id, operation_id, seq, hash
    FROM ledger.events
    ORDER BY tenant_id, operation_id, seq DESC
) AS head
WHERE o.tenant_id = head.tenant_id AND o.operation_id = head.operation_id
""",
    "SET LOCAL effect_ledger.maintenance = 'off'",
)


def upgrade() -> None:
    """Add and backfill the chain head columns."""
    for script in (COLUMNS, *CHECKS, *BACKFILL):
        execute_script(script)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
