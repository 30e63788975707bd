"""Citus: bind the tenant so that the workers see it; the write path's functions run on the tenant's worker.

Row-level security and the append-only trigger run where the rows are: on a Citus worker's shards.
A worker sees a setting of the coordinator's transaction only if Citus forwards it, and Citus forwards
`SET LOCAL` (with `citus.propagate_set_commands = 'local'`), never `set_config()`. SET cannot take a
bind parameter, so tenancy.bind_setting() issues the SET LOCAL itself, with the value quoted by the
server; it also switches the forwarding on for the transaction when a Citus session has it off. On
plain PostgreSQL it is exactly `set_config(name, value, true)`. It returns the database clock, so the
tenant binding stays one round trip.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from effect_ledger.db.migrate import distribute_functions, execute_script

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

BIND_SETTING = r"""
-- Its own schema: the reader role binds a tenant too, and has no business in schema ledger.
CREATE SCHEMA tenancy;
REVOKE ALL ON SCHEMA tenancy FROM PUBLIC;
GRANT USAGE ON SCHEMA tenancy TO effect_ledger_runtime, effect_ledger_diag_reader;
CREATE FUNCTION tenancy.bind_setting(name text, value text) RETURNS timestamptz
LANGUAGE plpgsql AS $$
BEGIN
    IF name NOT IN ('effect_ledger.tenant', 'effect_ledger.maintenance', 'effect_ledger.purge') THEN
        RAISE EXCEPTION 'tenancy.bind_setting sets the effect_ledger settings only, not %', name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- NULL on plain PostgreSQL; on Citus, forward SET LOCAL even if the session was not told to
    IF current_setting('citus.propagate_set_commands', true) = 'none' THEN
        PERFORM set_config('citus.propagate_set_commands', 'local', true);
    END IF;
    EXECUTE format('SET LOCAL %s = %L', name, value);
    RETURN clock_timestamp();
END
$$;
REVOKE ALL ON FUNCTION tenancy.bind_setting(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tenancy.bind_setting(text, text) TO effect_ledger_runtime, effect_ledger_diag_reader;
"""

# Two helpers of the write path (0005), replaced so that they also work when a function runs on the
# coordinator rather than on the tenant's worker (a call inside a transaction block, e.g. the sweeper's):
# lock_operation binds the tenant with SET LOCAL (forwarded to the workers) rather than set_config(), and
# append_events inserts each event with INSERT ... VALUES: Citus cannot route INSERT ... SELECT FROM a
# function (jsonb_to_recordset); it pulls the rows to the coordinator and COPYs them into the shard,
# which PostgreSQL refuses for a table with row-level security. Same behaviour on plain PostgreSQL.
WRITE_PATH_HELPERS = r"""
CREATE OR REPLACE FUNCTION ledger.lock_operation(tenant text, operation_id text) RETURNS ledger.operations
LANGUAGE plpgsql AS $$
DECLARE
    o ledger.operations;
BEGIN
    PERFORM tenancy.bind_setting('effect_ledger.tenant', tenant);
    SELECT * INTO o FROM ledger.operations AS t
    WHERE t.tenant_id = lock_operation.tenant AND t.operation_id = lock_operation.operation_id
    FOR UPDATE;
    RETURN o;
END
$$;

CREATE OR REPLACE FUNCTION ledger.append_events(o ledger.operations, events jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    e record;
BEGIN
    FOR e IN
        SELECT * FROM jsonb_to_recordset(events) AS r(
            seq integer, at timestamptz, kind text, actor text, from_status text, to_status text,
            attempt integer, data jsonb, prev_hash text, hash text)
    LOOP
        INSERT INTO ledger.events (
            tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data,
            prev_hash, hash)
        VALUES (o.tenant_id, o.operation_id, e.seq, e.at, e.kind, e.actor, e.from_status, e.to_status,
                e.attempt, e.data, e.prev_hash, e.hash);
    END LOOP;
END
$$;
"""

# On Citus, each call of a write-path function runs on the worker that holds its tenant's shards
# (delegated by its first argument, the tenant, co-located with ledger.operations): the function's
# statements then run there, next to the rows, in one round trip from the coordinator. Calls in
# autocommit (the service's) are delegated; a call inside a transaction block runs on the coordinator,
# statement by statement, still one shard each. Nothing on plain PostgreSQL.
DISTRIBUTED_FUNCTIONS = (
    "ledger.claim(text, text, text, text, text, text, integer, bytea, bytea, bytea, boolean, text)",
    "ledger.submit(text, text, bytea, text, integer)",
    "ledger.heartbeat(text, text, bytea, integer)",
    "ledger.complete(text, text, text, bytea, text, text, text, jsonb)",
    "ledger.resolve(text, text, text, text, text, text, text)",
    "ledger.sweep(text, text)",
)


def upgrade() -> None:
    """tenancy.bind_setting, the write path's helpers that Citus can route, its functions distributed."""
    for script in (BIND_SETTING, WRITE_PATH_HELPERS):
        execute_script(script)
    distribute_functions(*DISTRIBUTED_FUNCTIONS, tenant_argument="tenant", force_delegation=False)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
