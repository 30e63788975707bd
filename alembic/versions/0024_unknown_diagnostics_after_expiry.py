"""complete(unknown) with diagnostics after the lease ran out records them (API.md section 6, round 24).

"`diagnostics` may ride along and the answer then carries `incident`." A report of `unknown` for an
operation already unknown (its lease ran out, or the sweep made it unknown) answered 200 but recorded
nothing: it only looked for an incident stored by an earlier report of the attempt, and found none on
the first. The executor's timeout details were lost. `ledger.complete` now records the attempt's first
diagnostics as any report of unknown is recorded: a `completed` event (unknown -> unknown) naming the
incident, and the incident row, in the same transaction; a repeat names the incident stored first.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06
"""

from effect_ledger.db.migrate import apply_functions

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The write path's functions again (ledger.complete)."""
    apply_functions()


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
