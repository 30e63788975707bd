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

from effect_ledger.db.migrate import distribute_functions, execute_script

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

FUNCTIONS = r"""
-- A tenant batch's start: every command names the batch's tenant (else the statement fails before any
-- command runs), and the batch's own lock_timeout for this transaction. `commands` is any of the four
-- command types (each has a `tenant` attribute).
CREATE OR REPLACE FUNCTION ledger.open_tenant_batch(tenant text, lock_wait text, commands anyarray)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(commands) AS b WHERE to_jsonb(b) ->> 'tenant' IS DISTINCT FROM open_tenant_batch.tenant) THEN
        RAISE EXCEPTION 'a batch of one tenant carries a command of another' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('lock_timeout', lock_wait, true);
END
$$;

CREATE OR REPLACE FUNCTION ledger.claim_tenant_batch(
    tenant text, lock_wait text, commands ledger.claim_command[])
RETURNS TABLE (i integer, outcome text, events jsonb, db_now timestamptz, approval jsonb, op ledger.operations)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ledger.open_tenant_batch(claim_tenant_batch.tenant, lock_wait, commands);
    RETURN QUERY
    SELECT b.i, c.outcome, c.events, c.db_now, c.approval, c.op
    FROM unnest(commands) AS b
    CROSS JOIN LATERAL ledger.claim(claim_tenant_batch.tenant, b.operation_id, b.principal, b.tool,
        b.tool_version, b.intent_digest, b.lease_seconds, b.nonce_hash, b.token_hash, b.sealed_token,
        b.submit, b.effect_ref, b.approval_policy) AS c;
END
$$;

CREATE OR REPLACE FUNCTION ledger.submit_tenant_batch(
    tenant text, lock_wait text, commands ledger.submit_command[])
RETURNS TABLE (i integer, outcome text, events jsonb, db_now timestamptz, op ledger.operations)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ledger.open_tenant_batch(submit_tenant_batch.tenant, lock_wait, commands);
    RETURN QUERY
    SELECT b.i, c.outcome, c.events, c.db_now, c.op
    FROM unnest(commands) AS b
    CROSS JOIN LATERAL ledger.submit(submit_tenant_batch.tenant, b.operation_id, b.token_hash, b.effect_ref,
        b.lease_seconds) AS c;
END
$$;

CREATE OR REPLACE FUNCTION ledger.heartbeat_tenant_batch(
    tenant text, lock_wait text, commands ledger.heartbeat_command[])
RETURNS TABLE (i integer, outcome text, events jsonb, db_now timestamptz, op ledger.operations)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ledger.open_tenant_batch(heartbeat_tenant_batch.tenant, lock_wait, commands);
    RETURN QUERY
    SELECT b.i, c.outcome, c.events, c.db_now, c.op
    FROM unnest(commands) AS b
    CROSS JOIN LATERAL ledger.heartbeat(heartbeat_tenant_batch.tenant, b.operation_id, b.token_hash,
        b.lease_seconds) AS c;
END
$$;

CREATE OR REPLACE FUNCTION ledger.complete_tenant_batch(
    tenant text, lock_wait text, commands ledger.complete_command[])
RETURNS TABLE (i integer, outcome text, events jsonb, db_now timestamptz, incident_ref text, op ledger.operations)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ledger.open_tenant_batch(complete_tenant_batch.tenant, lock_wait, commands);
    RETURN QUERY
    SELECT b.i, c.outcome_code, c.events, c.db_now, c.incident_ref, c.op
    FROM unnest(commands) AS b
    CROSS JOIN LATERAL ledger.complete(complete_tenant_batch.tenant, b.operation_id, b.actor, b.token_hash,
        b.outcome, b.receipt, b.reason, b.incident) AS c;
END
$$;
"""

DISTRIBUTED_FUNCTIONS = (
    "ledger.open_tenant_batch(text, text, anyarray)",  # on the workers, where the four call it
    "ledger.claim_tenant_batch(text, text, ledger.claim_command[])",
    "ledger.submit_tenant_batch(text, text, ledger.submit_command[])",
    "ledger.heartbeat_tenant_batch(text, text, ledger.heartbeat_command[])",
    "ledger.complete_tenant_batch(text, text, ledger.complete_command[])",
)


def upgrade() -> None:
    """The four per-tenant batch functions, distributed by their tenant on Citus."""
    execute_script(FUNCTIONS)
    distribute_functions(*DISTRIBUTED_FUNCTIONS, tenant_argument="tenant", force_delegation=False)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
