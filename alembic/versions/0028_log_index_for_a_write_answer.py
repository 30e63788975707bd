"""The write answers' log_index rule in one function (the statements of 0027 each spelled it out).

`ledger.log_index_for(tenant, op, outcome)`: NULL for a row that is not committed or that the call
itself committed (`completed`, `resolved`), else `ledger.log_index_of` (migration 0027). SQL and
STABLE, so it is inlined into each write-path statement as the CASE the statements held, with no
call of its own on the hot path; it reads no table itself (the look-up stays in the PL/pgSQL function),
so Citus still delegates every write statement whole (a subquery of a distributed table beside the
delegated call is what it does not plan: 0027).

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-08
"""

from effect_ledger.db.migrate import distribute_functions, execute_script

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

FUNCTION = r"""
-- The log index a write-path statement answers beside its function's row `op` and `outcome`: NULL
-- without a look-up unless the row is committed by an earlier call (API.md 5, 14).
CREATE OR REPLACE FUNCTION ledger.log_index_for(tenant text, op ledger.operations, outcome text)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN (op).status = 'committed' AND outcome NOT IN ('completed', 'resolved')
                THEN ledger.log_index_of(tenant, (op).operation_id) END
$$;
"""


def upgrade() -> None:
    """ledger.log_index_for, distributed by its tenant on Citus (it exists on the workers)."""
    execute_script(FUNCTION)
    distribute_functions(
        "ledger.log_index_for(text, ledger.operations, text)", tenant_argument="tenant", force_delegation=False
    )


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
