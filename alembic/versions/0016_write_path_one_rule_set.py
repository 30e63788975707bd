"""The write-path functions are the one rule set: no second guards in the tables (issue 20 item 1,
round 4).

Every INSERT and UPDATE of `ledger.operations` parsed the cross-column check `operations_outcome_record`
from its stored text and planned it again (0.26 M instructions per effect cycle, callgrind), and
every event INSERT ran the events -> operations foreign key's RI query (0.15 - 0.17 M). Both only
repeated what the functions already decide where the row is locked (STYLE.md, "The write path"):
- a committed operation keeps its receipt, a not_applied one its reason: ledger.complete and
  ledger.resolve refuse a report without (check_violation, nothing written; alembic/functions);
- a purge point's seq and hash are written together, by the tombstone statement
  (db/queries.sql `tombstone_operations`, and log-recover's `log_make_tombstone`), from the row's chain head;
- an event is appended only by a write-path function, for the row it holds locked, and the purge
  deletes an ID's events with its row (`purge_events` beside `purge_operations`, one transaction).
tests/integration/test_row_checks.py proves each rule through the functions and statements that
keep it. The one-column rules stay domains (0014): they cost nothing on the statements that do not
assign their column.

The indexes stay as they are. Measured and not done (docs/performance.md, round 4): one index over
every terminal row in place of `operations_purgeable` and `operations_tombstones` (-0.06 M per
cycle) would make the purge's candidate scan walk every tombstone first (a tombstone keeps the
`updated_at` it was purged for, so all of them are older than any row still to purge); the feed's
index over unpositioned rows too (-0.04 M) would sort the sequencer's whole backlog every batch.

Then the functions are applied again (their files changed with this migration: the claim reads the
row back only when its insert lost; submit and complete lock the row reading only the columns their
decision needs; complete and resolve keep the outcome-record rule).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from effect_ledger.db.migrate import apply_functions, execute_script

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# One statement per script: Citus forwards ALTER TABLE and index DDL on a distributed table to the
# workers with the script's whole text, which a worker refuses as several commands.
STATEMENTS = (
    "ALTER TABLE ledger.operations DROP CONSTRAINT operations_outcome_record",
    "ALTER TABLE ledger.events DROP CONSTRAINT events_tenant_id_operation_id_fkey",
)


def upgrade() -> None:
    """Drop the second guards, apply the functions again."""
    for statement in STATEMENTS:
        execute_script(statement)
    apply_functions()


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
