-- The lean yardstick (issue 20): the durable work of one effect cycle on a minimal schema, the limit
-- that the service's own tables and SQL are measured against. One operation row with three secondary
-- indexes (as a work list, a lease sweep and a per-principal listing need), three chained event rows,
-- three statements in autocommit (three commits). No row-level security, triggers, checks or
-- foreign keys: everything the real schema adds is what its rows cost above this one.

-- name: lean_schema
-- The minimal tables, created by the owner and used by the runtime role (pgbench connects as it).
DROP SCHEMA IF EXISTS lean CASCADE;
CREATE SCHEMA lean;
CREATE TABLE lean.operations (
    tenant_id text NOT NULL,
    operation_id text NOT NULL,
    principal text NOT NULL,
    tool text NOT NULL,
    tool_version text NOT NULL,
    intent_digest text NOT NULL,
    status text NOT NULL,
    attempt integer NOT NULL,
    claim_token_hash bytea,
    client_nonce_hash bytea,
    sealed_token bytea,
    lease_seconds integer NOT NULL,
    lease_expires_at timestamptz,
    effect_ref text,
    receipt jsonb,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    submitted_at timestamptz,
    resolved_at timestamptz,
    resolved_by text,
    chain_seq integer NOT NULL,
    chain_hash text NOT NULL,
    PRIMARY KEY (tenant_id, operation_id)
);
CREATE INDEX ON lean.operations (tenant_id, status, updated_at);
CREATE INDEX ON lean.operations (tenant_id, lease_expires_at);
CREATE INDEX ON lean.operations (tenant_id, principal, created_at);
CREATE TABLE lean.events (
    tenant_id text NOT NULL,
    operation_id text NOT NULL,
    seq integer NOT NULL,
    at timestamptz NOT NULL,
    kind text NOT NULL,
    actor text NOT NULL,
    from_status text,
    to_status text,
    attempt integer NOT NULL,
    data jsonb NOT NULL,
    prev_hash text NOT NULL,
    hash text NOT NULL,
    PRIMARY KEY (tenant_id, operation_id, seq)
);
GRANT USAGE ON SCHEMA lean TO effect_ledger_runtime;
GRANT SELECT, INSERT, UPDATE ON lean.operations, lean.events TO effect_ledger_runtime;

-- name: lean_claim
-- Claim: the operation row and its `claimed` event in one statement (parameters as bench_yardstick_claim).
WITH inserted AS (
    INSERT INTO lean.operations (
        tenant_id, operation_id, principal, tool, tool_version, intent_digest, status, attempt,
        claim_token_hash, client_nonce_hash, sealed_token, lease_seconds, lease_expires_at,
        created_at, updated_at, chain_seq, chain_hash)
    VALUES ($1, $2, $3, $4, $5, $6, 'pending', 1, $7, $8, $9, $10,
            clock_timestamp() + make_interval(secs => $10::integer), clock_timestamp(), clock_timestamp(), 1, $11)
    ON CONFLICT (tenant_id, operation_id) DO NOTHING
    RETURNING tenant_id, operation_id, created_at
)
INSERT INTO lean.events (
    tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
SELECT tenant_id, operation_id, 1, created_at, 'claimed', $3, NULL, 'pending', 1, $12, $13, $11
FROM inserted;

-- name: lean_submit
-- Submit: pending -> submitted, guarded by status and token hash, and its event, in one statement.
WITH updated AS (
    UPDATE lean.operations SET
        status = 'submitted', effect_ref = $3, submitted_at = clock_timestamp(),
        lease_expires_at = clock_timestamp() + make_interval(secs => lease_seconds),
        updated_at = clock_timestamp(), chain_seq = chain_seq + 1, chain_hash = $5
    WHERE tenant_id = $1 AND operation_id = $2 AND status = 'pending' AND claim_token_hash = $4
    RETURNING tenant_id, operation_id, chain_seq, updated_at, attempt, principal
)
INSERT INTO lean.events (
    tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
SELECT tenant_id, operation_id, chain_seq, updated_at, 'submitted', principal, 'pending', 'submitted',
       attempt, $6, $7, $5
FROM updated;

-- name: lean_complete
-- Complete: submitted -> committed with its receipt, guarded by status and token hash, and its event.
WITH updated AS (
    UPDATE lean.operations SET
        status = 'committed', receipt = $3, lease_expires_at = NULL, resolved_at = clock_timestamp(),
        resolved_by = principal, updated_at = clock_timestamp(), chain_seq = chain_seq + 1, chain_hash = $5
    WHERE tenant_id = $1 AND operation_id = $2 AND status = 'submitted' AND claim_token_hash = $4
    RETURNING tenant_id, operation_id, chain_seq, updated_at, attempt, principal
)
INSERT INTO lean.events (
    tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
SELECT tenant_id, operation_id, chain_seq, updated_at, 'completed', principal, 'submitted', 'committed',
       attempt, $6, $7, $5
FROM updated;
