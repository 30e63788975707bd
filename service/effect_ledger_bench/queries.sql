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
