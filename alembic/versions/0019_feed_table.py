"""Feed positions in a narrow table of their own, not on the operation's row (issues 20 and 22, round 16).

Until now a committed operation got its feed position (its leaf index + 1 in the receipts log) by an
UPDATE of its `ledger.operations` row after it committed (`feed_assign`). `feed_position` sat in two
indexes (`operations_feed`, and the predicate of `operations_unpositioned`), so that update was never
HOT: each committed row was written a fourth time, whole (receipt, sealed token, hashes: ~0.5 kB), with
a new entry in every index whose predicate it matches (the primary key, `operations_by_status`,
`operations_feed`, `operations_purgeable`), and the dead version left to vacuum. With the receipts log
on (the default) that is every receipt, at once: logcpu measured 20 us of PostgreSQL per receipt for
the sequencing alone (round 16), more than the integrator's own statements (17 us).

Now:
- `ledger.feed_pending (tenant_id, resolved_at, operation_id)`: committed operations waiting for a
  position. ledger.complete and ledger.resolve insert the row in the transaction that commits the
  operation (in place of the `operations_unpositioned` entry the same update made); the sequencer
  deletes it when it hands out the position. It stays as small as the backlog.
- `ledger.feed (tenant_id, feed_position, operation_id)`: the positions, insert-only (log-recover aside),
  the primary key is the feed's order, a unique index maps an operation to its position.
- `ledger.operations` loses `feed_position` and both feed indexes.

What is committed keeps its position: existing positions move to `ledger.feed`, committed rows without
one to `ledger.feed_pending`. Both tables are tenant-isolated like the others and, on Citus,
distributed by tenant and co-located with `ledger.operations`.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""

from effect_ledger.db.migrate import apply_functions, distribute_by_tenant, execute_script, isolate_by_tenant

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

TABLES = r"""
CREATE TABLE ledger.feed (
    tenant_id     text                 NOT NULL,
    feed_position ledger.feed_position NOT NULL,
    operation_id  text                 NOT NULL,
    PRIMARY KEY (tenant_id, feed_position)
);
CREATE UNIQUE INDEX feed_operation ON ledger.feed (tenant_id, operation_id);
CREATE TABLE ledger.feed_pending (
    tenant_id    text        NOT NULL,
    resolved_at  timestamptz NOT NULL,
    operation_id text        NOT NULL,
    PRIMARY KEY (tenant_id, resolved_at, operation_id)
);
-- the write path inserts pending rows; the sequencer (reads.sequence_receipts, under the runtime
-- role when the feed is read) moves them to the feed
GRANT SELECT, INSERT, DELETE ON ledger.feed_pending TO effect_ledger_runtime;
GRANT SELECT, INSERT ON ledger.feed TO effect_ledger_runtime;
"""

# Across tenants, so with the maintenance switch (0002), set by SET LOCAL alone in its script so that
# Citus forwards it to the workers (0007's pattern); each statement moves rows within one tenant, so
# Citus pushes it down to every co-located shard.
MOVE = (
    "SET LOCAL effect_ledger.maintenance = 'on'",
    r"""
INSERT INTO ledger.feed (tenant_id, feed_position, operation_id)
SELECT tenant_id, feed_position, operation_id FROM ledger.operations WHERE feed_position IS NOT NULL
""",
    r"""
INSERT INTO ledger.feed_pending (tenant_id, resolved_at, operation_id)
SELECT tenant_id, resolved_at, operation_id FROM ledger.operations
WHERE status = 'committed' AND feed_position IS NULL
""",
    "SET LOCAL effect_ledger.maintenance = 'off'",
)

# One statement per script: Citus forwards DDL on a distributed table with the script's whole text.
DROP = (
    "DROP INDEX ledger.operations_feed",
    "DROP INDEX ledger.operations_unpositioned",
    "ALTER TABLE ledger.operations DROP COLUMN feed_position",
)


def upgrade() -> None:
    """The two tables, the positions moved into them, the column and its indexes dropped, the write
    path's functions applied again (complete and resolve insert the pending row)."""
    execute_script(TABLES)
    isolate_by_tenant("ledger.feed", "ledger.feed_pending")
    distribute_by_tenant("ledger.feed", "ledger.feed_pending")
    for statement in (*MOVE, *DROP):
        execute_script(statement)
    apply_functions()


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
