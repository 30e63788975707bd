"""The hash of the event that committed an operation, kept on its row (issue 22, round 24).

A receipt's leaf in the verifiable log records `chain_hash`, "the operation's last event hash at
commit" (API.md section 14). The integrator took the row's current chain head, and the checkpointer
compared every new and audited leaf with the row's current head. A retried complete (or resolve) that
reports another outcome for a committed operation is answered 409 conflicting_outcome and appends a
`discrepancy` event, which moves the head on: recorded before the receipt was logged, the integrator
found no receipt in the discrepancy's data and refused the tenant's log on every pass; recorded after,
the checkpointer's audit found the leaf's chain hash changed and signed no checkpoint for the tenant
again. A legitimate call stopped a tenant's log for good.

`ledger.operations.commit_hash` now holds the hash of the event that put the operation into
committed: ledger.complete and ledger.resolve set it in the UPDATE that records the commit (no statement
more), a tombstone keeps it, log-recover sets it from the leaf it restores. The integrator writes it
into the leaf (after checking that the chain's committing event has exactly that hash) and the
checkpointer compares leaves with it. Existing committed rows get their committing event's hash, or,
with no event left (a tombstone), their chain head (what the log recorded for them).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""

from effect_ledger.db.migrate import apply_functions, execute_script

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

# Across tenants, so with the maintenance switch (0002), set by SET LOCAL alone in its script so that
# Citus forwards it to the workers (0007's pattern); each statement joins rows of one tenant, so Citus
# pushes it down to every co-located shard.
FILL = (
    "SET LOCAL effect_ledger.maintenance = 'on'",
    r"""
UPDATE ledger.operations AS o SET commit_hash = c.hash
FROM (
    SELECT DISTINCT ON (e.tenant_id, e.operation_id) e.tenant_id, e.operation_id, e.hash
    FROM ledger.events AS e
    WHERE e.to_status = 'committed' AND e.from_status IS DISTINCT FROM 'committed'
    ORDER BY e.tenant_id, e.operation_id, e.seq DESC
) AS c
WHERE o.tenant_id = c.tenant_id AND o.operation_id = c.operation_id AND o.status = 'committed'
""",
    "UPDATE ledger.operations SET commit_hash = chain_hash WHERE status = 'committed' AND commit_hash IS NULL",
    "SET LOCAL effect_ledger.maintenance = 'off'",
)


def upgrade() -> None:
    """The column (one statement in its script: Citus forwards DDL on a distributed table with the
    script's whole text), the existing commits' hashes, the functions that set it."""
    execute_script("ALTER TABLE ledger.operations ADD COLUMN commit_hash text")
    for statement in FILL:
        execute_script(statement)
    apply_functions()


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
