"""The write path's lookups use the primary key from the first call (issue 20): one index fewer.

On a new or emptied `ledger.operations` every index estimates one row, so the cost of the write
path's `tenant_id = $1 AND operation_id = $2` lookups tied between the primary key and any other
index led by `tenant_id` (`operations_by_created`, `operations_by_status`: `operation_id` is a
non-leading key of both), and the planner kept the newest one. PL/pgSQL and the foreign key's check
cache that generic plan for the session, so the lookups scanned the tenant's whole range of
`operations_by_created`, more pages every cycle, until autovacuum's first analyze replanned them (the
bench's fresh database: 8 such scans and ~130 shared buffers per cycle).

Now no other index can serve those lookups at all:
- `operations_by_created` goes; the unfiltered reconciler list is one ordered branch per status of
  `operations_by_status`, merged (`list_operations`), and every transition inserts one index entry
  fewer;
- `operations_by_status` becomes partial, on a predicate every row satisfies (the status CHECK's set
  and `created_at IS NOT NULL`): a query can use it only by implying the predicate — a status and a
  bound on `created_at`, as the listing queries have and no lookup by ID has.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from effect_ledger.db.migrate import execute_script

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# One statement per call: Citus forwards a DROP INDEX of a distributed table to the workers as the
# query string it was given, and a worker refuses a string of several commands.
INDEXES = (
    "DROP INDEX ledger.operations_by_created",
    "DROP INDEX ledger.operations_by_status",
    # The reconciler lists by status (and, one branch per status, without one). Partial on a predicate
    # every row satisfies (the status CHECK's set; created_at is NOT NULL), so only a query that
    # implies it can use it: the lists (a status, and a bound on created_at), never a lookup by ID,
    # even one that names a status.
    """CREATE INDEX operations_by_status ON ledger.operations (tenant_id, status, created_at, operation_id)
    WHERE status IN ('pending', 'submitted', 'committed', 'not_applied', 'unknown')
      AND created_at IS NOT NULL""",
)


def upgrade() -> None:
    """Drop operations_by_created; operations_by_status partial on the status set."""
    for statement in INDEXES:
        execute_script(statement)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
