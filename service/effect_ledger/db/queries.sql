-- The query catalogue: every statement the service runs, each under a `-- name:` line and a
-- one-line purpose. Loaded once by catalogue.py and called by name; nothing is built by formatting.
-- Every statement names tenant_id explicitly even though row-level security also enforces it.

-- name: tenant_context
-- Bind the transaction to the caller's tenant (RLS reads it; SET LOCAL, so Citus workers see it too)
-- and read the database clock.
SELECT $1::text AS tenant, tenancy.bind_setting('effect_ledger.tenant', $1::text) AS db_now;

-- name: insert_first_attempt
-- A first claim: insert the operation and its `claimed` event; NULL means someone else has it
-- (function ledger.insert_first_attempt, migration 0008: one round trip, one Citus shard).
SELECT ledger.insert_first_attempt($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15);

-- name: read_operation
-- One operation, with the head of its event chain (kept on the row) and the database clock; no lock.
SELECT o.*, clock_timestamp() AS db_now
FROM ledger.operations AS o
WHERE o.tenant_id = $1 AND o.operation_id = $2;

-- name: apply_change
-- Write an operation's new state and chain head and append its events, in one round trip (function
-- ledger.apply_change, migration 0008: each of its statements stays on one Citus shard).
SELECT ledger.apply_change($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                           $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28);

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

-- ---------------------------------------------------------------------------------------------
-- Citus helpers for migrations (effect_ledger.db.migrate: distribute_by_tenant, reference_tables,
-- distribute_functions), run only when citus_installed says so; see docs/citus.md.
-- ---------------------------------------------------------------------------------------------

-- name: citus_installed
-- Whether this database has the citus extension (a Citus coordinator).
SELECT count(*) > 0 FROM pg_extension WHERE extname = 'citus';

-- name: citus_local_setting
-- A setting for the rest of the migration's transaction (only citus.* settings are passed here).
SELECT set_config($1::text, $2::text, true);

-- name: citus_distribute_table
-- Distribute a table by tenant_id in ledger.operations' co-location group, unless it already is.
SELECT create_distributed_table(
    $1::regclass, 'tenant_id',
    colocate_with => CASE WHEN $1::regclass = 'ledger.operations'::regclass
                          THEN 'default' ELSE 'ledger.operations' END)
WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = $1::regclass);

-- name: citus_reference_table
-- Copy a table without a tenant to every node, unless it already is distributed.
SELECT create_reference_table($1::regclass)
WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = $1::regclass);

-- name: citus_distribute_function
-- Run a function on the worker holding its tenant's shard (by the named argument), in transactions too.
SELECT create_distributed_function(
    $1::regprocedure, $2::text, colocate_with => 'ledger.operations', force_delegation => true);

-- name: migration_head
-- The migration the database is at.
SELECT version_num FROM public.alembic_version;

-- ---------------------------------------------------------------------------------------------
-- Reconciliation, audit and maintenance (issue 3).
-- Keyset bounds are written `k >= $a AND (k > $a OR id > $b)` rather than as a row comparison:
-- under row-level security only leakproof quals may become index conditions, and the leading
-- timestamptz bound is leakproof on every supported PostgreSQL, so the scan starts at the cursor.
-- ---------------------------------------------------------------------------------------------

-- name: list_operations
-- Reconciler list without a status filter: one page of the tenant's operations in creation order.
SELECT o.*, $6::timestamptz AS db_now
FROM ledger.operations AS o
WHERE o.tenant_id = $1
  AND o.created_at >= $2 AND (o.created_at > $2 OR o.operation_id > $3)
  AND ($4::text IS NULL OR o.tool = $4)
  AND ($5::timestamptz IS NULL OR o.updated_at < $5)
ORDER BY o.created_at, o.operation_id
LIMIT $7;

-- name: list_operations_by_status
-- Reconciler list of one stored status; `submitted` means live leases only (an expired one is unknown).
SELECT o.*, $6::timestamptz AS db_now
FROM ledger.operations AS o
WHERE o.tenant_id = $1 AND o.status = $8
  AND o.created_at >= $2 AND (o.created_at > $2 OR o.operation_id > $3)
  AND ($4::text IS NULL OR o.tool = $4)
  AND ($5::timestamptz IS NULL OR o.updated_at < $5)
  AND (o.status <> 'submitted' OR o.lease_expires_at > $6)
ORDER BY o.created_at, o.operation_id
LIMIT $7;

-- name: list_unknown_operations
-- Reconciler list of unknown outcomes: stored unknown plus submitted whose lease has expired, unswept.
-- Two ordered index scans merged (Merge Append), so the page needs no sort of the whole set.
SELECT * FROM (
    (SELECT o.*, $6::timestamptz AS db_now
     FROM ledger.operations AS o
     WHERE o.tenant_id = $1 AND o.status = 'unknown'
       AND o.created_at >= $2 AND (o.created_at > $2 OR o.operation_id > $3)
       AND ($4::text IS NULL OR o.tool = $4)
       AND ($5::timestamptz IS NULL OR o.updated_at < $5)
     ORDER BY o.created_at, o.operation_id
     LIMIT $7)
    UNION ALL
    (SELECT o.*, $6::timestamptz AS db_now
     FROM ledger.operations AS o
     WHERE o.tenant_id = $1 AND o.status = 'submitted' AND o.lease_expires_at <= $6
       AND o.created_at >= $2 AND (o.created_at > $2 OR o.operation_id > $3)
       AND ($4::text IS NULL OR o.tool = $4)
       AND ($5::timestamptz IS NULL OR o.updated_at < $5)
     ORDER BY o.created_at, o.operation_id
     LIMIT $7)
) AS page
ORDER BY created_at, operation_id
LIMIT $7;

-- name: list_receipts
-- Receipts feed: committed operations by resolution time, over the partial index operations_receipts.
SELECT o.*, clock_timestamp() AS db_now
FROM ledger.operations AS o
WHERE o.tenant_id = $1 AND o.status = 'committed'
  AND o.resolved_at >= $2 AND (o.resolved_at > $2 OR o.operation_id > $3)
  AND o.resolved_at >= $4 AND o.resolved_at < $5
  AND ($6::text IS NULL OR o.tool = $6)
  AND ($7::text IS NULL OR o.principal = $7)
ORDER BY o.resolved_at, o.operation_id
LIMIT $8;

-- name: operation_chain
-- One operation's row status and attempt beside each of its events in seq order, for verification;
-- the LEFT JOIN keeps an operation whose events were all removed (one row, NULL seq).
SELECT o.operation_id, o.status AS op_status, o.attempt AS op_attempt, e.seq, e.at, e.kind, e.actor,
       e.from_status, e.to_status, e.attempt, e.data, e.prev_hash, e.hash
FROM ledger.operations AS o
LEFT JOIN ledger.events AS e ON e.tenant_id = o.tenant_id AND e.operation_id = o.operation_id
WHERE o.tenant_id = $1 AND o.operation_id = $2
ORDER BY e.seq;

-- name: tenant_chains
-- Every operation of the tenant with its events, in (operation_id, seq) order, streamed by verify.
SELECT o.operation_id, o.status AS op_status, o.attempt AS op_attempt, e.seq, e.at, e.kind, e.actor,
       e.from_status, e.to_status, e.attempt, e.data, e.prev_hash, e.hash
FROM ledger.operations AS o
LEFT JOIN ledger.events AS e ON e.tenant_id = o.tenant_id AND e.operation_id = o.operation_id
WHERE o.tenant_id = $1
ORDER BY o.operation_id, e.seq;

-- name: list_access_log
-- Auditors' view of who read which incident, when and why, oldest first.
SELECT access_id, at, incident_id, principal, purpose
FROM diagnostics.access_log
WHERE tenant_id = $1
  AND at >= $2 AND (at > $2 OR access_id > $3)
  AND at >= $4
ORDER BY at, access_id
LIMIT $5;

-- name: lock_operation
-- Lock one operation FOR UPDATE and read it, chain head included, with the clock read after the lock
-- is granted. After waiting for a concurrent transition, FOR UPDATE returns the row version that
-- transition committed, and every event append moves the head on the row: the head is current.
SELECT o.*, clock_timestamp() AS db_now
FROM ledger.operations AS o
WHERE o.tenant_id = $1 AND o.operation_id = $2
FOR UPDATE;

-- name: try_maintenance_lock
-- One sweeper (or purger) across all replicas: a session advisory lock, never waited for.
SELECT pg_try_advisory_lock($1::integer, $2::integer);

-- name: release_maintenance_lock
-- Give the advisory lock back at the end of a run (closing the session would too).
SELECT pg_advisory_unlock($1::integer, $2::integer);

-- name: maintenance_scope
-- Let this owner transaction see every tenant (policy `maintenance`, migration 0002), or stop it.
SELECT tenancy.bind_setting('effect_ledger.maintenance', $1::text);

-- name: sweep_candidates
-- A batch of submitted operations whose lease has expired, across tenants, not locked here: each is
-- then locked by its tenant (lock_operation_unless_held), since Citus locks rows of one shard at a time.
SELECT tenant_id, operation_id
FROM ledger.operations
WHERE status = 'submitted' AND lease_expires_at <= clock_timestamp()
ORDER BY lease_expires_at
LIMIT $1;

-- name: lock_operation_unless_held
-- lock_operation for the sweeper: a row that a request holds is skipped (SKIP LOCKED, no row back), so
-- the sweeper never waits on the hot path.
SELECT o.*, clock_timestamp() AS db_now
FROM ledger.operations AS o
WHERE o.tenant_id = $1 AND o.operation_id = $2
FOR UPDATE SKIP LOCKED;

-- name: purge_candidates
-- A batch of terminal operations untouched for the retention period, across tenants, not locked here
-- (lock_purgeable locks them by tenant). Only committed and not_applied qualify: pending, submitted and
-- unknown are never purged.
SELECT tenant_id, operation_id
FROM ledger.operations
WHERE status IN ('committed', 'not_applied') AND updated_at < clock_timestamp() - make_interval(days => $1)
ORDER BY updated_at
LIMIT $2;

-- name: lock_purgeable
-- Lock those of one tenant's candidates that still qualify; rows a request holds are skipped.
SELECT operation_id
FROM ledger.operations
WHERE tenant_id = $1 AND operation_id = ANY($2::text[])
  AND status IN ('committed', 'not_applied') AND updated_at < clock_timestamp() - make_interval(days => $3)
FOR UPDATE SKIP LOCKED;

-- name: purge_mode
-- The events trigger allows DELETE only in a transaction that sets this (the purge path).
SELECT tenancy.bind_setting('effect_ledger.purge', 'on');

-- name: purge_events
-- Delete the events of one tenant's given operations (before the operations: the foreign key).
DELETE FROM ledger.events
WHERE tenant_id = $1 AND operation_id = ANY($2::text[]);

-- name: purge_operations
-- Delete one tenant's given operations (locked by lock_purgeable in this transaction, so still terminal).
DELETE FROM ledger.operations
WHERE tenant_id = $1 AND operation_id = ANY($2::text[]);

-- ---------------------------------------------------------------------------------------------
-- Protected diagnostics (API.md section 9). The runtime role inserts incidents but cannot read
-- them, so nothing here uses RETURNING on incidents; the reader role reads them and appends to
-- the access log in the same transaction.

-- name: insert_incident
-- Store one incident (id made by the caller); created_at defaults to the database clock.
INSERT INTO diagnostics.incidents (
    tenant_id, incident_id, source, principal, operation_id, attempt, phase, cause, http_status,
    provider, provider_request_id, retryable_hint, elapsed_ms, detail_code, headers, route, method,
    exception_type, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
        COALESCE($19::timestamptz, clock_timestamp()));

-- name: read_incident
-- One incident of the tenant (reader role only).
SELECT tenant_id AS tenant, incident_id, created_at, source, principal, operation_id, attempt, phase,
       cause, http_status, provider, provider_request_id, retryable_hint, elapsed_ms, detail_code,
       headers, route, method, exception_type
FROM diagnostics.incidents
WHERE tenant_id = $1 AND incident_id = $2;

-- name: append_access_log
-- Record who read which incident, when and why; commits with the read or not at all.
INSERT INTO diagnostics.access_log (tenant_id, access_id, at, incident_id, principal, purpose)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: outcome_incident_reference
-- The incident stored by this attempt's report of `unknown`, so that a repeated report answers the same.
SELECT data->>'incident'
FROM ledger.events
WHERE tenant_id = $1 AND operation_id = $2 AND attempt = $3 AND kind = 'completed' AND to_status = 'unknown'
ORDER BY seq DESC
LIMIT 1;

-- name: purge_cutoffs
-- The database clock's cutoffs for incidents ($1 days) and access-log rows ($2 days).
SELECT clock_timestamp() - make_interval(days => $1) AS incidents_before,
       clock_timestamp() - make_interval(days => $2) AS access_log_before;

-- name: purge_incidents_batch
-- Delete up to $2 incidents created before $1 (oldest first, by incidents_age), across tenants.
-- Runs as the owner in maintenance scope (policy `maintenance`), so it sees every tenant.
DELETE FROM diagnostics.incidents
WHERE (tenant_id, incident_id) IN (
    SELECT tenant_id, incident_id FROM diagnostics.incidents
    WHERE created_at < $1 ORDER BY created_at LIMIT $2);

-- name: purge_access_log_batch
-- Delete up to $2 access-log rows written before $1 (by access_log_age), across tenants.
DELETE FROM diagnostics.access_log
WHERE (tenant_id, access_id) IN (
    SELECT tenant_id, access_id FROM diagnostics.access_log
    WHERE at < $1 ORDER BY at LIMIT $2);

-- ---------------------------------------------------------------------------------------------
-- Benchmark (`effect-ledger bench`): run as the owner on the bench's own databases, never by serve.
-- ---------------------------------------------------------------------------------------------

-- name: bench_database_ddl
-- CREATE and DROP of a benchmark database, with its name quoted by the server rather than by us.
SELECT format('CREATE DATABASE %I', $1::text) AS create_database,
       format('DROP DATABASE IF EXISTS %I WITH (FORCE)', $1::text) AS drop_database;

-- name: bench_server
-- The server's version and the backend serving this connection (its parent is the postmaster).
SELECT current_setting('server_version') AS version, pg_backend_pid() AS backend_pid;

-- name: bench_bulk_operations
-- Growth history streamed into COPY: committed operations n = $2..$3 of tenant $1 (recent, so no purge
-- takes them during a run). Columns are named as in ledger.operations; the rest stay NULL.
SELECT $1::text AS tenant_id, 'bulk-' || n AS operation_id, 'bench-history' AS principal,
       'bench.transfer' AS tool, '1.0.0' AS tool_version,
       'sha256:' || md5(n::text) || md5('intent-' || n) AS intent_digest, 'committed' AS status,
       1 AS attempt, decode(md5('token-' || n), 'hex') AS claim_token_hash, 30 AS lease_seconds,
       'ref-' || n AS effect_ref,
       jsonb_build_object('external_ref', 'rcpt-' || n, 'result_digest', NULL, 'result', NULL,
                          'observed_at', NULL, 'recorded_by', 'bench-history',
                          'recorded_at', to_char(t.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))
           AS receipt,
       t.at AS created_at, t.at AS updated_at, t.at AS submitted_at, t.at AS resolved_at,
       'bench-history' AS resolved_by
FROM generate_series($2::bigint, $3::bigint) AS n
CROSS JOIN LATERAL (SELECT now() - interval '2 days' + (n % 86400000) * interval '1 millisecond' AS at) AS t;

-- name: bench_bulk_events
-- One event per bulk operation n = $2..$3 of tenant $1, for COPY; the hashes are filler, not a chain.
SELECT $1::text AS tenant_id, 'bulk-' || n AS operation_id, 1 AS seq,
       now() - interval '2 days' + (n % 86400000) * interval '1 millisecond' AS at,
       'claimed' AS kind, 'bench-history' AS actor, 'pending' AS to_status, 1 AS attempt,
       jsonb_build_object('lease_expires_at', 'n/a') AS data, repeat('0', 64) AS prev_hash,
       md5('event-' || n) || md5('hash-' || n) AS hash
FROM generate_series($2::bigint, $3::bigint) AS n;

-- name: bench_analyze
-- Fresh planner statistics after a bulk load.
ANALYZE ledger.operations, ledger.events;

-- name: bench_checkpoint
-- Flush a bulk load before measuring, so no checkpoint of it lands inside a measured window.
CHECKPOINT;

-- name: bench_relation_sizes
-- Bytes of each ledger table with its TOAST and indexes, of its indexes alone, and its estimated rows.
SELECT relname AS name, pg_total_relation_size(oid) AS total_bytes, pg_indexes_size(oid) AS index_bytes,
       reltuples::bigint AS estimated_rows
FROM pg_class
WHERE oid IN ('ledger.operations'::regclass, 'ledger.events'::regclass)
ORDER BY relname DESC;

-- name: bench_committed_ids
-- Up to $3 committed operation IDs of tenant $1 that start with $2 (the service phase's own): claiming
-- them again, with the same binding, measures the replay path.
SELECT operation_id FROM ledger.operations
WHERE tenant_id = $1 AND status = 'committed' AND starts_with(operation_id, $2)
LIMIT $3;
