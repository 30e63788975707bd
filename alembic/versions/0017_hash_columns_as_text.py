"""The chain's hash columns as plain text: the `ledger.hex64` domain off the columns only the write
path and the purge compute (issue 20 item 1, round 12).

`events.prev_hash`, `events.hash` and `operations.chain_hash` are written only by the write-path
functions, from `ledger.event_hash` (sha256, lowercase hex) or from the row's chain head, and
`operations.purged_hash` only by the tombstone statements, from the row's chain head. Every event
INSERT checked the domain's regular expression twice and every transition's UPDATE once more: nine
tests per effect cycle of a value PostgreSQL had just computed, 0.096 M instructions per cycle
(callgrind, docs/performance.md round 4). A malformed hash could only come from a database writer
going around the functions, and the chain verification (`/v1/audit/verify`, the receipts log's
integrator) refuses such a chain whatever its characters. The domain's rule is no second guard to
keep (STYLE.md, the write path: the decision is taken once, where the row is locked).

text is the domain's base type: the columns change type without a table rewrite, readers see text as
before. The domain itself is dropped (nothing else uses it).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""

from effect_ledger.db.migrate import apply_functions, execute_script

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# (table, column): one statement per script, as Citus forwards ALTER TABLE to the workers as written
COLUMNS = (
    ("ledger.events", "prev_hash"),
    ("ledger.events", "hash"),
    ("ledger.operations", "chain_hash"),
    ("ledger.operations", "purged_hash"),
)


def upgrade() -> None:
    """The four columns to text, the domain dropped, the functions (and their row type) again."""
    for table, column in COLUMNS:
        execute_script(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE text")
    execute_script("DROP DOMAIN ledger.hex64")
    apply_functions()


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
