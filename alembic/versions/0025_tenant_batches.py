"""Natural batching on Citus: one tenant's waiting calls in one statement on that tenant's worker (issue 20
item 5, round 35).

The batch statements of 0020 (`run_claim_batch`, ...) call a write-path function once per command in
one statement: on plain PostgreSQL a batch may carry several tenants (each call binds its own). On Citus
such a statement is not delegated to a worker: it runs on the coordinator, and every call's statements
go to the workers one by one, so the batcher was off there. A function distributed by its tenant
argument is delegated whole, set-returning too (`SELECT ... FROM f($1, ...)`: one command to one
worker, the test_citus tests). These four take one tenant's commands (the command types of 0020) and
answer exactly what the batch statements answer, a row per command: the batcher sends them on Citus,
one tenant's waiting calls of one function at a time (db/batching.WriteBatcher.per_tenant).

Each binds nothing itself: every command's function binds the tenant (the argument, not the command's
own field, which must equal it: a command of another tenant is refused with an error before anything
runs, and the batch then fails whole, as any failed batch). The batch's own lock_timeout is set first,
as the batch statements set it. Both are ledger.open_tenant_batch, which the four call first.

PL/pgSQL, not SQL: a set-returning SQL function in FROM may be inlined into the calling statement, and
Citus would then see the statement the function wraps, which it does not delegate.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07
"""

import textwrap

from effect_ledger.db.migrate import distribute_functions, execute_script

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

OPEN = r"""
-- A tenant batch's start: every command names the batch's tenant (else the statement fails before any
-- command runs), and the batch's own lock_timeout for this transaction. `commands` is any of the four
-- command types (each has a `tenant` attribute).
CREATE OR REPLACE FUNCTION ledger.open_tenant_batch(tenant text, lock_wait text, commands anyarray)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(commands) AS b
               WHERE to_jsonb(b) ->> 'tenant' IS DISTINCT FROM open_tenant_batch.tenant) THEN
        RAISE EXCEPTION 'a batch of one tenant carries a command of another'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('lock_timeout', lock_wait, true);
END
$$;
"""

# Per function: the answer's columns after `i` (as the catalogue's run_<call>_batch answers them), what
# of the function's row fills them, and the function's arguments after its tenant (the command type's
# attributes, in the function's parameter order).
CALLS = {
    "claim": (
        "outcome text, events jsonb, db_now timestamptz, approval jsonb, op ledger.operations",
        "c.outcome, c.events, c.db_now, c.approval, c.op",
        "b.operation_id, b.principal, b.tool, b.tool_version, b.intent_digest, b.lease_seconds, b.nonce_hash,"
        " b.token_hash, b.sealed_token, b.submit, b.effect_ref, b.approval_policy",
    ),
    "submit": (
        "outcome text, events jsonb, db_now timestamptz, op ledger.operations",
        "c.outcome, c.events, c.db_now, c.op",
        "b.operation_id, b.token_hash, b.effect_ref, b.lease_seconds",
    ),
    "heartbeat": (
        "outcome text, events jsonb, db_now timestamptz, op ledger.operations",
        "c.outcome, c.events, c.db_now, c.op",
        "b.operation_id, b.token_hash, b.lease_seconds",
    ),
    "complete": (
        "outcome text, events jsonb, db_now timestamptz, incident_ref text, op ledger.operations",
        "c.outcome_code, c.events, c.db_now, c.incident_ref, c.op",
        "b.operation_id, b.actor, b.token_hash, b.outcome, b.receipt, b.reason, b.incident",
    ),
}


def _wrapped(arguments: str) -> str:
    """A call's arguments on lines of their own, indented under it."""
    return textwrap.fill(arguments, 96, initial_indent=" " * 8, subsequent_indent=" " * 8)


def tenant_batch(call: str, columns: str, answer: str, arguments: str) -> str:
    """ledger.<call>_tenant_batch: one tenant's commands, each through ledger.<call> under that tenant."""
    return f"""
CREATE OR REPLACE FUNCTION ledger.{call}_tenant_batch(
    tenant text, lock_wait text, commands ledger.{call}_command[])
RETURNS TABLE (i integer, {columns})
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ledger.open_tenant_batch({call}_tenant_batch.tenant, lock_wait, commands);
    RETURN QUERY
    SELECT b.i, {answer}
    FROM unnest(commands) AS b
    CROSS JOIN LATERAL ledger.{call}(
{_wrapped(f"{call}_tenant_batch.tenant, {arguments}")}) AS c;
END
$$;
"""


DISTRIBUTED_FUNCTIONS = (
    "ledger.open_tenant_batch(text, text, anyarray)",  # on the workers, where the four call it
    *(f"ledger.{call}_tenant_batch(text, text, ledger.{call}_command[])" for call in CALLS),
)


def upgrade() -> None:
    """The four per-tenant batch functions, distributed by their tenant on Citus."""
    execute_script(OPEN + "".join(tenant_batch(call, *parts) for call, parts in CALLS.items()))
    distribute_functions(*DISTRIBUTED_FUNCTIONS, tenant_argument="tenant", force_delegation=False)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
