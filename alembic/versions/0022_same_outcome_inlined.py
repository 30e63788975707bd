"""ledger.same_outcome without a subquery (issue 20, round 23).

complete and resolve compare a report with a terminal operation's recorded outcome through
`ledger.same_outcome` (a repeat answers `unchanged`, anything else `conflicting_outcome`). Its body
compared the receipt's four content members in a subquery over `unnest(ARRAY[...])`; a SQL function
with a subquery is never inlined into the caller's expression, and PostgreSQL parsed, analysed and
planned its body again on every call: ~0.3 M instructions a repeated complete (PostgreSQL 15,
callgrind). The four members are now compared one by one in a plain expression, which the planner
inlines; and the comparison moved out of the functions' outcome CASE into the branch that reads a
terminal row, because PL/pgSQL sets up a whole expression (its unreached branches too) in every
transaction that evaluates it: inlined inside the CASE, it cost every fresh cycle 0.04 M. The same
answers (the contract and conflict tests).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

from effect_ledger.db.migrate import apply_functions

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The write path's functions again (same_outcome, and where complete and resolve call it)."""
    apply_functions()


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
