"""The last table checks of the write path become domains or one check; leaner write-path functions
(issue 20 item 1, round 3).

Every INSERT and UPDATE statement parses each CHECK constraint of its table from its stored text
(`stringToNode`) and plans it again (`ExecConstraints` -> `ExecPrepareExpr`), whichever columns it
sets: with nine checks on `ledger.operations` and one on `ledger.events`, 30 parses per cycle and
0.68 M instructions, 15 % of PostgreSQL's work in one effect cycle (callgrind, docs/write-path.md).
A domain's check comes from the type cache, already parsed, and runs only for the columns a statement
assigns. So:
- the six one-column checks become domains (the same accepted values): `ledger.attempt` (>= 1),
  `ledger.chain_seq` (>= 0: chain_seq and purged_seq), `ledger.feed_position` (>= 1),
  `ledger.lease_seconds` (1 - 3600), `ledger.operation_status` (the five states), and
  `ledger.event_seq` (>= 1) for the events' seq;
- the three cross-column checks (a committed row keeps its receipt or its digest, a not_applied row
  its reason or its purge point, the purge point's seq and hash together) become one check,
  `operations_outcome_record`: one parse per statement instead of three.

PostgreSQL sends a domain column's base type to clients, so readers see integer and text as before.

Then the functions are applied again from alembic/functions/ (their files changed with this
migration: the event hash in one format() call, the tenant bound by an assignment rather than a
PERFORM, submit's and a new claim's events inserted inline).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from effect_ledger.db.migrate import apply_functions, execute_script

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

DOMAINS = (
    "CREATE DOMAIN ledger.attempt AS integer CHECK (VALUE >= 1)",
    "CREATE DOMAIN ledger.chain_seq AS integer CHECK (VALUE >= 0)",
    "CREATE DOMAIN ledger.event_seq AS integer CHECK (VALUE >= 1)",
    "CREATE DOMAIN ledger.feed_position AS bigint CHECK (VALUE >= 1)",
    "CREATE DOMAIN ledger.lease_seconds AS integer CHECK (VALUE >= 1 AND VALUE <= 3600)",
    "CREATE DOMAIN ledger.operation_status AS text"
    " CHECK (VALUE IN ('pending', 'submitted', 'committed', 'not_applied', 'unknown'))",
)
# (table, the check it replaces, column, domain)
COLUMNS = (
    ("ledger.operations", "operations_attempt_check", "attempt", "ledger.attempt"),
    ("ledger.operations", "operations_chain_seq_check", "chain_seq", "ledger.chain_seq"),
    ("ledger.operations", "operations_purged_seq_check", "purged_seq", "ledger.chain_seq"),
    ("ledger.operations", "operations_feed_position_check", "feed_position", "ledger.feed_position"),
    ("ledger.operations", "operations_lease_seconds_check", "lease_seconds", "ledger.lease_seconds"),
    ("ledger.operations", "operations_status_check", "status", "ledger.operation_status"),
    ("ledger.events", "events_seq_check", "seq", "ledger.event_seq"),
)
CROSS_CHECKS = ("operations_committed_receipt", "operations_not_applied_reason", "operations_purge_point")
# One statement per script: Citus forwards ALTER TABLE ... ADD CONSTRAINT to the workers as written.
OUTCOME_RECORD = """ALTER TABLE ledger.operations ADD CONSTRAINT operations_outcome_record CHECK (
    (status <> 'committed' OR receipt IS NOT NULL OR receipt_digest IS NOT NULL)
    AND (status <> 'not_applied' OR not_applied_reason IS NOT NULL OR purged_seq IS NOT NULL)
    AND (purged_seq IS NULL) = (purged_hash IS NULL))"""


def upgrade() -> None:
    """One-column checks as domains, the cross-column ones as one check, the functions again."""
    for script in DOMAINS:
        execute_script(script)
    for table, check, column, domain in COLUMNS:
        execute_script(f"ALTER TABLE {table} DROP CONSTRAINT {check}")
        execute_script(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {domain}")
    for check in CROSS_CHECKS:
        execute_script(f"ALTER TABLE ledger.operations DROP CONSTRAINT {check}")
    execute_script(OUTCOME_RECORD)
    apply_functions()


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
