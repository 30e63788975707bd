"""The hot transitions' events answer without the event's actor and data (issue 20, round 23).

The write-path functions answer the events they appended (`events`) beside the operation's row. For a
claimed, submitted or completed event that answer carried the event's actor and data too, which the
service never reads: the metrics count events by kind and statuses, a span records the attempt, and a
completed event's data is the whole receipt, which the answer's `op` carries already. The database built
it into every answer (`jsonb_build_object` copies it) and asyncpg decoded it again in Python.
`ledger.event_json` now takes and answers the kind, the two statuses and the attempt; the cold
transitions (a discrepancy, a lease expiry, a reclaim) still answer ledger.append_event's whole event.
What is stored and hashed is unchanged.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

from effect_ledger.db.migrate import apply_functions, execute_script

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The functions again (their event_json calls), then the six-argument event_json they called."""
    apply_functions()
    execute_script("DROP FUNCTION IF EXISTS ledger.event_json(text, text, text, text, integer, jsonb);")


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
