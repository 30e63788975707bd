"""The write path's batch statements take their commands as one array of a composite type (issue 20, round 23).

Natural batching (db/batching.py) sends the waiting calls of one function in one statement. Until now
the statement took one array per parameter (`unnest($2::int[], $3::text[], ...)`: 14 arrays for a
claim). asyncpg encodes an array by asking of every element whether it is itself an array (two or
three `isinstance` checks against `collections.abc` classes, each a Python-level call), so a batch of
four claims cost ~120 such calls, ~19 a request: ~5 % of the repository layer's Python (round 22's
profile). One array of composites (`unnest($2::ledger.claim_command[])`) asks that once per command.

A type per batched function, its attributes in the function's parameter order, `i` (the command's
place in the batch) first. Only the batch statements use them; the functions are unchanged.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from effect_ledger.db.migrate import execute_script

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

TYPES = r"""
CREATE TYPE ledger.claim_command AS (
    i integer, tenant text, operation_id text, principal text, tool text, tool_version text,
    intent_digest text, lease_seconds integer, nonce_hash bytea, token_hash bytea, sealed_token bytea,
    submit boolean, effect_ref text, approval_policy jsonb);
CREATE TYPE ledger.submit_command AS (
    i integer, tenant text, operation_id text, token_hash bytea, effect_ref text, lease_seconds integer);
CREATE TYPE ledger.heartbeat_command AS (
    i integer, tenant text, operation_id text, token_hash bytea, lease_seconds integer);
CREATE TYPE ledger.complete_command AS (
    i integer, tenant text, operation_id text, actor text, token_hash bytea, outcome text, receipt text,
    reason text, incident jsonb);
"""


def upgrade() -> None:
    """The four command types."""
    execute_script(TYPES)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
