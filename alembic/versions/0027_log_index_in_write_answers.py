"""The write calls' answers carry `log_index` as every read's view does (API.md sections 5 and 14).

Section 5: "Every endpoint that returns an operation returns this object"; section 14: "The operation
view of a logged receipt carries `"log_index": i` (else `null`)". Until now only the reads showed it:
a `reuse_receipt` claim, a repeated complete or resolve, or a refusal showing a committed operation
answered its view without the member. The write-path statements now answer `log_index` beside the
function's row, in the same statement (one round trip still): NULL for a row that is not committed or
that this very call committed (`completed`, `resolved`: its feed position is handed out after its
transaction commits), so the hot path pays one test of the row's status in the statement; else
`ledger.log_index_of`, read_operation's rule: its feed position minus one once a signed checkpoint
covers it.

PL/pgSQL, called only behind that test: a SQL function would be inlined into the statement, and Citus
plans no statement with a subquery of a distributed table beside a delegated function call ("could not
create distributed plan"). Distributed by its tenant argument, so that it exists on the workers, where
the delegated statements evaluate it next to the call: every write call stays one command to one
worker (test_citus).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07
"""

from effect_ledger.db.migrate import distribute_functions, execute_script

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

FUNCTION = r"""
-- The log index of a committed operation: its leaf in the tenant's receipts log once a signed checkpoint
-- covers its feed position, as read_operation has it (NULL before). The write-path statements call it
-- only for a committed row the call did not commit itself.
CREATE OR REPLACE FUNCTION ledger.log_index_of(tenant text, operation_id text)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT f.feed_position - 1 FROM ledger.feed AS f
            WHERE f.tenant_id = log_index_of.tenant AND f.operation_id = log_index_of.operation_id
              AND f.feed_position <= (SELECT max(c.size) FROM ledger.log_checkpoints AS c
                                      WHERE c.tenant_id = log_index_of.tenant));
END
$$;
"""


def upgrade() -> None:
    """ledger.log_index_of, distributed by its tenant on Citus."""
    execute_script(FUNCTION)
    distribute_functions(
        "ledger.log_index_of(text, text)", tenant_argument="tenant", force_delegation=False
    )


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
