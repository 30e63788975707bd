"""Citus: bind the tenant so that the workers see it; claim and transition writes routed to one shard.

Row-level security and the append-only trigger run where the rows are: on a Citus worker's shards.
A worker sees a setting of the coordinator's transaction only if Citus forwards it, and Citus forwards
`SET LOCAL` (with `citus.propagate_set_commands = 'local'`), never `set_config()`. SET cannot take a
bind parameter, so tenancy.bind_setting() issues the SET LOCAL itself, with the value quoted by the
server; it also switches the forwarding on for the transaction when a Citus session has it off. On
plain PostgreSQL it is exactly `set_config(name, value, true)`. It returns the database clock, so the
tenant binding stays one round trip.

Revision ID: 0008
Revises: 0004
Create Date: 2026-11-30
"""

from effect_ledger.db.migrate import execute_script

revision = "0008"
down_revision = "0004"
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

# A transition's write: the operation's new state and chain head, then its events, one INSERT ... VALUES
# each. One statement (`INSERT ... SELECT FROM unnest(...)`) did this before, but Citus cannot route an
# INSERT whose rows come from a function: it pulls them to the coordinator and COPYs them into the
# shard, and PostgreSQL refuses COPY FROM into a table with row-level security. In PL/pgSQL each
# statement is a single-shard (router) statement on Citus; on plain PostgreSQL, still one round trip.
APPLY_CHANGE = r"""
CREATE FUNCTION ledger.apply_change(
    p_tenant text, p_operation text, p_status text, p_attempt integer, p_claim_token_hash bytea,
    p_client_nonce_hash bytea, p_sealed_token bytea, p_lease_seconds integer,
    p_lease_expires_at timestamptz, p_effect_ref text, p_receipt jsonb, p_not_applied_reason jsonb,
    p_updated_at timestamptz, p_submitted_at timestamptz, p_resolved_at timestamptz, p_resolved_by text,
    e_seq integer[], e_at timestamptz[], e_kind text[], e_actor text[], e_from_status text[],
    e_to_status text[], e_attempt integer[], e_data jsonb[], e_prev_hash text[], e_hash text[],
    p_chain_seq integer, p_chain_hash text
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ledger.operations SET
        status = p_status, attempt = p_attempt, claim_token_hash = p_claim_token_hash,
        client_nonce_hash = p_client_nonce_hash, sealed_token = p_sealed_token,
        lease_seconds = p_lease_seconds, lease_expires_at = p_lease_expires_at, effect_ref = p_effect_ref,
        receipt = p_receipt, not_applied_reason = p_not_applied_reason, updated_at = p_updated_at,
        submitted_at = p_submitted_at, resolved_at = p_resolved_at, resolved_by = p_resolved_by,
        chain_seq = p_chain_seq, chain_hash = p_chain_hash
    WHERE tenant_id = p_tenant AND operation_id = p_operation;
    FOR i IN 1 .. coalesce(array_length(e_seq, 1), 0) LOOP
        INSERT INTO ledger.events (
            tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data,
            prev_hash, hash)
        VALUES (p_tenant, p_operation, e_seq[i], e_at[i], e_kind[i], e_actor[i], e_from_status[i],
                e_to_status[i], e_attempt[i], e_data[i], e_prev_hash[i], e_hash[i]);
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION ledger.apply_change FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger.apply_change TO effect_ledger_runtime;
"""

# A first claim: the operation and its `claimed` event, or nothing when the ID exists (ON CONFLICT DO
# NOTHING waits for a concurrent inserter to commit, so exactly one claimant wins). As one statement with
# a data-modifying CTE, Citus ran the event insert as a second step pulled through the coordinator.
INSERT_FIRST_ATTEMPT = r"""
CREATE FUNCTION ledger.insert_first_attempt(
    p_tenant text, p_operation text, p_principal text, p_tool text, p_tool_version text,
    p_intent_digest text, p_claim_token_hash bytea, p_client_nonce_hash bytea, p_sealed_token bytea,
    p_lease_seconds integer, p_lease_expires_at timestamptz, p_at timestamptz, p_data jsonb,
    p_prev_hash text, p_hash text
) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger.operations (
        tenant_id, operation_id, principal, tool, tool_version, intent_digest, status, attempt,
        claim_token_hash, client_nonce_hash, sealed_token, lease_seconds, lease_expires_at,
        created_at, updated_at, chain_seq, chain_hash)
    VALUES (p_tenant, p_operation, p_principal, p_tool, p_tool_version, p_intent_digest, 'pending', 1,
            p_claim_token_hash, p_client_nonce_hash, p_sealed_token, p_lease_seconds, p_lease_expires_at,
            p_at, p_at, 1, p_hash)
    ON CONFLICT (tenant_id, operation_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO ledger.events (
        tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
    VALUES (p_tenant, p_operation, 1, p_at, 'claimed', p_principal, NULL, 'pending', 1, p_data,
            p_prev_hash, p_hash);
    RETURN 1;
END
$$;
REVOKE ALL ON FUNCTION ledger.insert_first_attempt FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger.insert_first_attempt TO effect_ledger_runtime;
"""


def upgrade() -> None:
    """Create tenancy.bind_setting (how the service binds its settings) and the two write functions."""
    for script in (BIND_SETTING, APPLY_CHANGE, INSERT_FIRST_ATTEMPT):
        execute_script(script)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
