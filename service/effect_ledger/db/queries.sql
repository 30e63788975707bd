-- The query catalogue: every statement the service runs, each under a `-- name:` line and a
-- one-line purpose. Loaded once by catalogue.py and called by name; nothing is built by formatting.
-- Every statement names tenant_id explicitly even though row-level security also enforces it.

-- name: tenant_context
-- Bind the transaction to the caller's tenant (RLS reads it) and read the database clock.
SELECT set_config('effect_ledger.tenant', $1::text, true) AS tenant, clock_timestamp() AS db_now;

-- name: insert_first_attempt
-- A first claim: insert the operation and its `claimed` event; no row back means someone else has it.
-- ON CONFLICT DO NOTHING waits for a concurrent inserter to commit, so exactly one claimant wins.
WITH inserted AS (
    INSERT INTO ledger.operations (
        tenant_id, operation_id, principal, tool, tool_version, intent_digest, status, attempt,
        claim_token_hash, client_nonce_hash, sealed_token, lease_seconds, lease_expires_at,
        created_at, updated_at)
    VALUES ($1, $2, $3, $4, $5, $6, 'pending', 1, $7, $8, $9, $10, $11, $12, $12)
    ON CONFLICT (tenant_id, operation_id) DO NOTHING
    RETURNING tenant_id, operation_id
)
INSERT INTO ledger.events (
    tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
SELECT tenant_id, operation_id, 1, $12, 'claimed', $3, NULL, 'pending', 1, $13, $14, $15
FROM inserted
RETURNING seq;

-- name: read_operation
-- One operation with the head of its event chain and the database clock, without locking.
SELECT o.*, e.seq AS last_seq, e.hash AS last_hash, clock_timestamp() AS db_now
FROM ledger.operations AS o
LEFT JOIN LATERAL (
    SELECT seq, hash FROM ledger.events AS ev
    WHERE ev.tenant_id = o.tenant_id AND ev.operation_id = o.operation_id
    ORDER BY seq DESC LIMIT 1
) AS e ON true
WHERE o.tenant_id = $1 AND o.operation_id = $2;

-- name: lock_operation
-- The same, locked FOR UPDATE: transitions on one operation are serialised on its row.
-- The clock is read after the lock is granted, so lease judgements are never stale.
SELECT o.*, e.seq AS last_seq, e.hash AS last_hash, clock_timestamp() AS db_now
FROM ledger.operations AS o
LEFT JOIN LATERAL (
    SELECT seq, hash FROM ledger.events AS ev
    WHERE ev.tenant_id = o.tenant_id AND ev.operation_id = o.operation_id
    ORDER BY seq DESC LIMIT 1
) AS e ON true
WHERE o.tenant_id = $1 AND o.operation_id = $2
FOR UPDATE OF o;

-- name: apply_change
-- Write an operation's new state (when $3) and append its events, in one round trip.
-- Data-modifying CTEs always run to completion, so the UPDATE happens even if no event is appended.
WITH updated AS (
    UPDATE ledger.operations SET
        status = $4, attempt = $5, claim_token_hash = $6, client_nonce_hash = $7, sealed_token = $8,
        lease_seconds = $9, lease_expires_at = $10, effect_ref = $11, receipt = $12,
        not_applied_reason = $13, updated_at = $14, submitted_at = $15, resolved_at = $16,
        resolved_by = $17
    WHERE tenant_id = $1 AND operation_id = $2 AND $3::boolean
    RETURNING operation_id
)
INSERT INTO ledger.events (
    tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
SELECT $1, $2, e.seq, e.at, e.kind, e.actor, e.from_status, e.to_status, e.attempt, e.data, e.prev_hash, e.hash
FROM unnest($18::integer[], $19::timestamptz[], $20::text[], $21::text[], $22::text[], $23::text[],
            $24::integer[], $25::jsonb[], $26::text[], $27::text[])
     AS e(seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash);

-- name: list_events
-- An operation's events in chain order.
SELECT seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash, operation_id
FROM ledger.events
WHERE tenant_id = $1 AND operation_id = $2
ORDER BY seq;

-- name: list_all_events
-- Every event of a tenant in (operation, seq) order, for whole-tenant chain verification.
SELECT seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash, operation_id
FROM ledger.events
WHERE tenant_id = $1
ORDER BY operation_id, seq;

-- name: set_role_password
-- Give a service role the password derived from the owner URL (quoted by the server, not by us).
SELECT set_config('effect_ledger.role_name', $1::text, false),
       set_config('effect_ledger.role_password', $2::text, false);

-- name: apply_role_password
-- Runs after set_role_password on the same connection.
DO $$
BEGIN
    EXECUTE format('ALTER ROLE %I WITH LOGIN PASSWORD %L',
                   current_setting('effect_ledger.role_name'), current_setting('effect_ledger.role_password'));
    PERFORM set_config('effect_ledger.role_password', '', false);
END
$$;

-- name: grant_migration_state
-- Let the runtime role see which migration the database is at (for /readyz).
GRANT SELECT ON public.alembic_version TO effect_ledger_runtime;

-- name: migration_head
-- The migration the database is at.
SELECT version_num FROM public.alembic_version;
