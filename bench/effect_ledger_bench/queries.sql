-- The bench's own statements (`effect-ledger bench`), kept out of the product's catalogue
-- (effect_ledger/db/queries.sql): run as the owner on the bench's own databases, never by serve.
-- Same format as the product's catalogue: a `-- name:` line and a one-line purpose per statement.

-- name: bench_database_ddl
-- CREATE and DROP of a benchmark database, with its name quoted by the server rather than by us.
SELECT format('CREATE DATABASE %I', $1::text) AS create_database,
       format('DROP DATABASE IF EXISTS %I WITH (FORCE)', $1::text) AS drop_database;

-- name: bench_server
-- The server's version and the backend serving this connection (its parent is the postmaster).
SELECT current_setting('server_version') AS version, pg_backend_pid() AS backend_pid;

-- name: bench_autovacuum_workers
-- Autovacuum workers running now, in any database of the server (settle waits for none).
SELECT count(*) AS workers FROM pg_stat_activity WHERE backend_type = 'autovacuum worker';

-- name: bench_vacuum_statement
-- The VACUUM (ANALYZE) of the connected database's tables that autovacuum would come back for (rows
-- changed since their last vacuum or analyse), NULL when there are none, and how many; Cluster.settle
-- runs it.
-- Never an empty table: its first vacuum sets reltuples to 0, and the planner's ten-page guess for a
-- never-vacuumed table is gone (round 13: after a vacuum of every table of the freshly migrated
-- service database, the in-process row ran at 544 instead of ~1,200 cycles/s, 2.08 ms of PostgreSQL a
-- cycle; most likely the write path's cached plans, made for tables planned as empty, scanning them).
SELECT 'VACUUM (ANALYZE) ' || string_agg(format('%I.%I', schemaname, relname), ', ' ORDER BY relname)
       AS statement, count(*) AS tables
FROM pg_stat_user_tables
WHERE n_live_tup > 0 AND (n_dead_tup > 0 OR n_ins_since_vacuum > 0 OR n_mod_since_analyze > 0);

-- name: bench_analyze_statement
-- The ANALYZE of the connected database's non-empty tables changed since their last analyse, NULL when
-- there are none, and how many; Cluster.analyze runs it after a layer's warm-up (round 22: see there).
SELECT 'ANALYZE ' || string_agg(format('%I.%I', schemaname, relname), ', ' ORDER BY relname)
       AS statement, count(*) AS tables
FROM pg_stat_user_tables
WHERE n_live_tup > 0 AND n_mod_since_analyze > 0;

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
-- Flush a bulk load before measuring, so no checkpoint of it lands inside a measured window; and before
-- every layer (Cluster.settle).
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

-- ---------------------------------------------------------------------------------------------
-- The previous write path (before migration 0005), kept for the bench's "old limit" row: a claim
-- was BEGIN, tenant_context, bench_previous_insert_first_attempt, COMMIT; a transition BEGIN,
-- tenant_context, bench_previous_lock_operation, bench_previous_apply_change, COMMIT.
-- ---------------------------------------------------------------------------------------------

-- name: bench_previous_insert_first_attempt
-- A first claim: insert the operation and its `claimed` event; no row back means someone else has it.
-- ON CONFLICT DO NOTHING waits for a concurrent inserter to commit, so exactly one claimant wins.
WITH inserted AS (
    INSERT INTO ledger.operations (
        tenant_id, operation_id, principal, tool, tool_version, intent_digest, status, attempt,
        claim_token_hash, client_nonce_hash, sealed_token, lease_seconds, lease_expires_at,
        created_at, updated_at, chain_seq, chain_hash)
    VALUES ($1, $2, $3, $4, $5, $6, 'pending', 1, $7, $8, $9, $10, $11, $12, $12, 1, $15)
    ON CONFLICT (tenant_id, operation_id) DO NOTHING
    RETURNING tenant_id, operation_id
)
INSERT INTO ledger.events (
    tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
SELECT tenant_id, operation_id, 1, $12, 'claimed', $3, NULL, 'pending', 1, $13, $14, $15
FROM inserted
RETURNING seq;

-- name: bench_previous_apply_change
-- Write an operation's new state and chain head and append its events, in one round trip.
-- Data-modifying CTEs always run to completion, so the UPDATE happens even if no event is appended;
-- every append moves the head on the row, so the row lock orders appends.
WITH updated AS (
    UPDATE ledger.operations SET
        status = $3, attempt = $4, claim_token_hash = $5, client_nonce_hash = $6, sealed_token = $7,
        lease_seconds = $8, lease_expires_at = $9, effect_ref = $10, receipt = $11,
        not_applied_reason = $12, updated_at = $13, submitted_at = $14, resolved_at = $15,
        resolved_by = $16, chain_seq = $27, chain_hash = $28
    WHERE tenant_id = $1 AND operation_id = $2
    RETURNING operation_id
)
INSERT INTO ledger.events (
    tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
SELECT $1, $2, e.seq, e.at, e.kind, e.actor, e.from_status, e.to_status, e.attempt, e.data, e.prev_hash, e.hash
FROM unnest($17::integer[], $18::timestamptz[], $19::text[], $20::text[], $21::text[], $22::text[],
            $23::integer[], $24::jsonb[], $25::text[], $26::text[])
     AS e(seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash);

-- name: bench_previous_lock_operation
-- Lock one operation FOR UPDATE and read it, chain head included, with the clock read after the lock
-- is granted. After waiting for a concurrent transition, FOR UPDATE returns the row version that
-- transition committed, and every event append moves the head on the row: the head is current.
SELECT o.*, clock_timestamp() AS db_now
FROM ledger.operations AS o
WHERE o.tenant_id = $1 AND o.operation_id = $2
FOR UPDATE;

-- ---------------------------------------------------------------------------------------------
-- The one-statement yardstick (issue 11): PostgreSQL alone doing the cycle's durable work, one
-- statement per call in autocommit, with the same rows and indexes (and row-level security, the
-- tenant bound once per session by pgbench's connection options).
-- ---------------------------------------------------------------------------------------------

-- name: bench_yardstick_claim
-- Claim: insert the operation row and its `claimed` event in one statement.
WITH inserted AS (
    INSERT INTO ledger.operations (
        tenant_id, operation_id, principal, tool, tool_version, intent_digest, status, attempt,
        claim_token_hash, client_nonce_hash, sealed_token, lease_seconds, lease_expires_at,
        created_at, updated_at, chain_seq, chain_hash)
    VALUES ($1, $2, $3, $4, $5, $6, 'pending', 1, $7, $8, $9, $10,
            clock_timestamp() + make_interval(secs => $10), clock_timestamp(), clock_timestamp(), 1, $11)
    ON CONFLICT (tenant_id, operation_id) DO NOTHING
    RETURNING tenant_id, operation_id, created_at
)
INSERT INTO ledger.events (
    tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
SELECT tenant_id, operation_id, 1, created_at, 'claimed', $3, NULL, 'pending', 1, $12, $13, $11
FROM inserted;

-- name: bench_yardstick_submit
-- Submit: pending -> submitted, guarded by status and token hash, and its event, in one statement.
WITH updated AS (
    UPDATE ledger.operations SET
        status = 'submitted', effect_ref = $3, submitted_at = clock_timestamp(),
        lease_expires_at = clock_timestamp() + make_interval(secs => lease_seconds),
        updated_at = clock_timestamp(), chain_seq = chain_seq + 1, chain_hash = $5
    WHERE tenant_id = $1 AND operation_id = $2 AND status = 'pending' AND claim_token_hash = $4
    RETURNING tenant_id, operation_id, chain_seq, updated_at, attempt, principal
)
INSERT INTO ledger.events (
    tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
SELECT tenant_id, operation_id, chain_seq, updated_at, 'submitted', principal, 'pending', 'submitted',
       attempt, $6, $7, $5
FROM updated;

-- name: bench_yardstick_complete
-- Complete: submitted -> committed with its receipt, guarded by status and token hash, and its event.
WITH updated AS (
    UPDATE ledger.operations SET
        status = 'committed', receipt = $3, lease_expires_at = NULL, resolved_at = clock_timestamp(),
        resolved_by = principal, updated_at = clock_timestamp(), chain_seq = chain_seq + 1, chain_hash = $5
    WHERE tenant_id = $1 AND operation_id = $2 AND status = 'submitted' AND claim_token_hash = $4
    RETURNING tenant_id, operation_id, chain_seq, updated_at, attempt, principal
)
INSERT INTO ledger.events (
    tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
SELECT tenant_id, operation_id, chain_seq, updated_at, 'completed', principal, 'submitted', 'committed',
       attempt, $6, $7, $5
FROM updated;

-- name: bench_log_size
-- Tenant $1's log size and the database's clock: sampled under load, and by loglag.settle (one
-- primary-key read); `signed`, the size of its latest checkpoint (0: none yet).
SELECT clock_timestamp() AS at, COALESCE(s.size, 0) AS logged, COALESCE(s.signed_size, 0) AS signed
FROM (SELECT 1) AS one
LEFT JOIN ledger.log_state AS s ON s.tenant_id = $1;

-- name: bench_committed_count
-- Tenant $1's committed receipts, read only while no load runs (a scan of the tenant's operations).
SELECT count(*) FROM ledger.operations WHERE tenant_id = $1 AND status = 'committed';

-- name: bench_commit_times
-- The feed position (NULL: not yet positioned) and commit time of tenant $1's receipts committed at or
-- after $2 (the first sample's clock), read once the load stopped.
SELECT f.feed_position AS feed_position, o.resolved_at
FROM ledger.operations AS o
LEFT JOIN ledger.feed AS f ON f.tenant_id = o.tenant_id AND f.operation_id = o.operation_id
WHERE o.tenant_id = $1 AND o.status = 'committed' AND o.resolved_at >= $2;

-- name: bench_statements_enable
-- pg_stat_statements' view in this database (repeat --statements); the server must preload the library.
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;

-- name: bench_statements_reset
-- Forget what this database's statements did so far (every user, every statement of it).
SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0);

-- name: bench_statements_read
-- What this database's statements did since the reset, the costliest first: the view's own figures,
-- nested statements (track = all) beside the top-level ones that ran them (`toplevel`); not the
-- bench's own reset and read.
SELECT s.toplevel, s.calls, s.total_exec_time AS exec_ms, s.rows, s.shared_blks_hit + s.shared_blks_read AS buffers,
       s.wal_bytes, s.query
FROM pg_stat_statements AS s
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND s.query NOT LIKE '%pg_stat_statements%'  -- the reset and this read, the bench's own
ORDER BY s.total_exec_time DESC;

-- name: bench_active_lanes
-- The wait events of the backends named $1 (serve's runtime pool: its write lanes) that are running a
-- statement now, this connection's own aside (lanes.LaneSampler, every 5 ms).
SELECT wait_event_type, wait_event
FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1 AND state = 'active'
  AND pid <> pg_backend_pid();
