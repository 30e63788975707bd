-- The query catalogue: every statement the service runs, each under a `-- name:` line and a
-- one-line purpose. Loaded once by catalogue.py and called by name; nothing is built by formatting.
-- Every statement names tenant_id explicitly even though row-level security also enforces it.

-- name: tenant_context
-- Bind the transaction to the caller's tenant (RLS reads it; SET LOCAL, so Citus workers see it too)
-- and read the database clock.
SELECT $1::text AS tenant, tenancy.bind_setting('effect_ledger.tenant', $1::text) AS db_now;

-- ---------------------------------------------------------------------------------------------
-- The write path (migration 0005): each call is one statement in autocommit, one round trip. The
-- function binds the tenant for its own transaction, locks, decides, writes state and events.
-- `op` is the operation row after the call as one composite column (NULL when there is none): the
-- server sends it as one binary record instead of expanding 28 field selections through the
-- FunctionScan (-0.22 M instructions per cycle over asyncpg, docs/performance.md round 5).
-- `log_index` (migrations 0027, 0028): the view's log index for that row, as read_operation has it;
-- ledger.log_index_for, inlined, looks it up only for a committed row the call did not commit itself
-- (a reuse_receipt claim, a repeated complete or resolve, a refusal showing a committed row), NULL
-- otherwise (API.md sections 5, 14).
-- ---------------------------------------------------------------------------------------------

-- name: run_claim
-- Claim (and, with $11, submit) an operation ID in one round trip; $13 is the approval policy's ask
-- (NULL: no rule covers the tool), and `approval` the request the gate spoke of (migration 0011).
SELECT c.outcome, c.events, c.db_now, to_jsonb(c.approval) AS approval, c.op,
       ledger.log_index_for($1, c.op, c.outcome) AS log_index
FROM ledger.claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) AS c;

-- name: run_submit
-- Submit (pending -> submitted) in one round trip.
SELECT c.outcome, c.events, c.db_now, c.op,
       ledger.log_index_for($1, c.op, c.outcome) AS log_index
FROM ledger.submit($1, $2, $3, $4, $5) AS c;

-- name: run_heartbeat
-- Extend a lease in one round trip.
SELECT c.outcome, c.events, c.db_now, c.op,
       ledger.log_index_for($1, c.op, c.outcome) AS log_index
FROM ledger.heartbeat($1, $2, $3, $4) AS c;

-- name: run_complete
-- Complete (with complete(unknown)'s incident, when $8 is given) in one round trip.
SELECT c.outcome_code AS outcome, c.events, c.db_now, c.incident_ref, c.op,
       ledger.log_index_for($1, c.op, c.outcome_code) AS log_index
FROM ledger.complete($1, $2, $3, $4, $5, $6, $7, $8) AS c;

-- The batch forms (db/batching.py: natural batching): the same function once per command, in one
-- statement and one commit. $1 is the batch's own lock_timeout (set by the statement before any call:
-- every call's tenant argument depends on it), $2 the commands in the lock order, one array of the
-- function's command type (migration 0020): each command's index in the batch (answered as `i`), then
-- the single statement's parameters.
-- name: run_claim_batch
-- Claims of one batch: $2 the commands (run_claim's parameters, the command's place `i` first).
SELECT b.i, c.outcome, c.events, c.db_now, to_jsonb(c.approval) AS approval, c.op,
       ledger.log_index_for(b.tenant, c.op, c.outcome) AS log_index
FROM (SELECT set_config('lock_timeout', $1::text, true)) AS cfg (lock_timeout)
CROSS JOIN unnest($2::ledger.claim_command[]) AS b
CROSS JOIN LATERAL ledger.claim(CASE WHEN cfg.lock_timeout IS NOT NULL THEN b.tenant END, b.operation_id,
    b.principal, b.tool, b.tool_version, b.intent_digest, b.lease_seconds, b.nonce_hash, b.token_hash,
    b.sealed_token, b.submit, b.effect_ref, b.approval_policy) AS c;

-- name: run_submit_batch
-- Submits of one batch.
SELECT b.i, c.outcome, c.events, c.db_now, c.op,
       ledger.log_index_for(b.tenant, c.op, c.outcome) AS log_index
FROM (SELECT set_config('lock_timeout', $1::text, true)) AS cfg (lock_timeout)
CROSS JOIN unnest($2::ledger.submit_command[]) AS b
CROSS JOIN LATERAL ledger.submit(CASE WHEN cfg.lock_timeout IS NOT NULL THEN b.tenant END, b.operation_id,
    b.token_hash, b.effect_ref, b.lease_seconds) AS c;

-- name: run_heartbeat_batch
-- Heartbeats of one batch.
SELECT b.i, c.outcome, c.events, c.db_now, c.op,
       ledger.log_index_for(b.tenant, c.op, c.outcome) AS log_index
FROM (SELECT set_config('lock_timeout', $1::text, true)) AS cfg (lock_timeout)
CROSS JOIN unnest($2::ledger.heartbeat_command[]) AS b
CROSS JOIN LATERAL ledger.heartbeat(CASE WHEN cfg.lock_timeout IS NOT NULL THEN b.tenant END,
    b.operation_id, b.token_hash, b.lease_seconds) AS c;

-- name: run_complete_batch
-- Completes of one batch.
SELECT b.i, c.outcome_code AS outcome, c.events, c.db_now, c.incident_ref, c.op,
       ledger.log_index_for(b.tenant, c.op, c.outcome_code) AS log_index
FROM (SELECT set_config('lock_timeout', $1::text, true)) AS cfg (lock_timeout)
CROSS JOIN unnest($2::ledger.complete_command[]) AS b
CROSS JOIN LATERAL ledger.complete(CASE WHEN cfg.lock_timeout IS NOT NULL THEN b.tenant END,
    b.operation_id, b.actor, b.token_hash, b.outcome, b.receipt, b.reason, b.incident) AS c;

-- The per-tenant batch forms (migration 0025), which the batcher sends on Citus: one tenant's commands
-- of one function, answered as the batch forms above answer; the function, distributed by $1, runs
-- whole on the worker holding the tenant (one command to one worker), sets $2 as its lock_timeout
-- and refuses a command of another tenant.
-- name: run_claim_tenant_batch
-- Claims of one tenant's batch.
SELECT c.i, c.outcome, c.events, c.db_now, c.approval, c.op,
       ledger.log_index_for($1, c.op, c.outcome) AS log_index
FROM ledger.claim_tenant_batch($1, $2, $3) AS c;

-- name: run_submit_tenant_batch
-- Submits of one tenant's batch.
SELECT c.i, c.outcome, c.events, c.db_now, c.op,
       ledger.log_index_for($1, c.op, c.outcome) AS log_index
FROM ledger.submit_tenant_batch($1, $2, $3) AS c;

-- name: run_heartbeat_tenant_batch
-- Heartbeats of one tenant's batch.
SELECT c.i, c.outcome, c.events, c.db_now, c.op,
       ledger.log_index_for($1, c.op, c.outcome) AS log_index
FROM ledger.heartbeat_tenant_batch($1, $2, $3) AS c;

-- name: run_complete_tenant_batch
-- Completes of one tenant's batch.
SELECT c.i, c.outcome, c.events, c.db_now, c.incident_ref, c.op,
       ledger.log_index_for($1, c.op, c.outcome) AS log_index
FROM ledger.complete_tenant_batch($1, $2, $3) AS c;

-- name: run_resolve
-- Resolve (or record an unresolved look-up) in one round trip.
SELECT c.outcome_code AS outcome, c.events, c.db_now, c.op,
       ledger.log_index_for($1, c.op, c.outcome_code) AS log_index
FROM ledger.resolve($1, $2, $3, $4, $5, $6, $7) AS c;

-- name: run_sweep
-- The sweeper's step for one locked candidate: lease_expired if (still) due, under the row's tenant.
SELECT c.outcome, c.events, c.db_now, c.op
FROM ledger.sweep($1, $2) AS c;

-- name: read_operation
-- One operation, with the head of its event chain (kept on the row) and the database clock; no lock.
-- log_index: its leaf in the tenant's receipts log once a signed checkpoint covers it (API.md 14):
-- its feed position (ledger.feed, migration 0019) minus one, probed for a committed row only.
SELECT o.*, clock_timestamp() AS db_now,
       CASE WHEN o.status = 'committed' THEN (
           SELECT f.feed_position - 1 FROM ledger.feed AS f
           WHERE f.tenant_id = $1 AND f.operation_id = o.operation_id AND f.feed_position <= (
               SELECT max(c.size) FROM ledger.log_checkpoints AS c WHERE c.tenant_id = $1))
       END AS log_index
FROM ledger.operations AS o
WHERE o.tenant_id = $1 AND o.operation_id = $2;

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
-- Run a function's calls on the worker holding its tenant's shard (by the named argument).
SELECT create_distributed_function(
    $1::regprocedure, $2::text, colocate_with => 'ledger.operations', force_delegation => $3::boolean);

-- name: migration_head
-- The migration the database is at.
SELECT version_num FROM public.alembic_version;

-- name: server_identity
-- Which server answers (readiness reports it, db/failover.py): its address, whether it is a standby
-- or read-only, and its WAL timeline, which a promotion bumps (read from the current WAL file's name:
-- pg_control_checkpoint() lags until the next checkpoint; a standby has no current WAL position).
SELECT host(inet_server_addr()) AS address, inet_server_port() AS port,
       pg_is_in_recovery() AS in_recovery,
       current_setting('transaction_read_only')::boolean AS read_only,
       CASE WHEN NOT pg_is_in_recovery()
            THEN ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer
       END AS timeline;

-- ---------------------------------------------------------------------------------------------
-- Reconciliation, audit and maintenance (issue 3).
-- Keyset bounds are written `k >= $a AND (k > $a OR id > $b)` rather than as a row comparison:
-- under row-level security only leakproof quals may become index conditions, and the leading
-- timestamptz bound is leakproof on every supported PostgreSQL, so the scan starts at the cursor.
-- ---------------------------------------------------------------------------------------------

-- name: list_operations
-- Reconciler list without a status filter: one page of the tenant's operations in creation order,
-- one ordered branch of operations_by_status per status merged (Merge Append: no sort of the set).
-- There is no index by creation alone (0013: it took the write path's lookups from the primary key).
-- log_index as read_operation has it (every read's view carries it, API.md 14): one InitPlan a page
-- for the log's size, and a probe of ledger.feed per committed row of the page (after the LIMIT).
SELECT page.*, CASE WHEN page.status = 'committed' THEN (
           SELECT f.feed_position - 1 FROM ledger.feed AS f
           WHERE f.tenant_id = $1 AND f.operation_id = page.operation_id AND f.feed_position <= (
               SELECT max(c.size) FROM ledger.log_checkpoints AS c WHERE c.tenant_id = $1))
       END AS log_index
FROM (
    (SELECT o.*, $6::timestamptz AS db_now
     FROM ledger.operations AS o
     WHERE o.tenant_id = $1 AND o.status = 'pending'
       AND o.created_at >= $2 AND (o.created_at > $2 OR o.operation_id > $3)
       AND ($4::text IS NULL OR o.tool = $4)
       AND ($5::timestamptz IS NULL OR o.updated_at < $5)
     ORDER BY o.created_at, o.operation_id
     LIMIT $7)
    UNION ALL
    (SELECT o.*, $6::timestamptz AS db_now
     FROM ledger.operations AS o
     WHERE o.tenant_id = $1 AND o.status = 'submitted'
       AND o.created_at >= $2 AND (o.created_at > $2 OR o.operation_id > $3)
       AND ($4::text IS NULL OR o.tool = $4)
       AND ($5::timestamptz IS NULL OR o.updated_at < $5)
     ORDER BY o.created_at, o.operation_id
     LIMIT $7)
    UNION ALL
    (SELECT o.*, $6::timestamptz AS db_now
     FROM ledger.operations AS o
     WHERE o.tenant_id = $1 AND o.status = 'committed'
       AND o.created_at >= $2 AND (o.created_at > $2 OR o.operation_id > $3)
       AND ($4::text IS NULL OR o.tool = $4)
       AND ($5::timestamptz IS NULL OR o.updated_at < $5)
     ORDER BY o.created_at, o.operation_id
     LIMIT $7)
    UNION ALL
    (SELECT o.*, $6::timestamptz AS db_now
     FROM ledger.operations AS o
     WHERE o.tenant_id = $1 AND o.status = 'not_applied'
       AND o.created_at >= $2 AND (o.created_at > $2 OR o.operation_id > $3)
       AND ($4::text IS NULL OR o.tool = $4)
       AND ($5::timestamptz IS NULL OR o.updated_at < $5)
     ORDER BY o.created_at, o.operation_id
     LIMIT $7)
    UNION ALL
    (SELECT o.*, $6::timestamptz AS db_now
     FROM ledger.operations AS o
     WHERE o.tenant_id = $1 AND o.status = 'unknown'
       AND o.created_at >= $2 AND (o.created_at > $2 OR o.operation_id > $3)
       AND ($4::text IS NULL OR o.tool = $4)
       AND ($5::timestamptz IS NULL OR o.updated_at < $5)
     ORDER BY o.created_at, o.operation_id
     LIMIT $7)
) AS page
ORDER BY created_at, operation_id
LIMIT $7;

-- name: list_operations_by_status
-- Reconciler list of one stored status; `submitted` means live leases only (an expired one is unknown).
SELECT o.*, $6::timestamptz AS db_now,
       CASE WHEN o.status = 'committed' THEN (
           SELECT f.feed_position - 1 FROM ledger.feed AS f
           WHERE f.tenant_id = $1 AND f.operation_id = o.operation_id AND f.feed_position <= (
               SELECT max(c.size) FROM ledger.log_checkpoints AS c WHERE c.tenant_id = $1))
       END AS log_index
FROM ledger.operations AS o
WHERE o.tenant_id = $1 AND o.status = $8
  AND o.status IN ('pending', 'submitted', 'committed', 'not_applied', 'unknown')  -- operations_by_status's predicate (with the created_at bound)
  AND o.created_at >= $2 AND (o.created_at > $2 OR o.operation_id > $3)
  AND ($4::text IS NULL OR o.tool = $4)
  AND ($5::timestamptz IS NULL OR o.updated_at < $5)
  AND (o.status <> 'submitted' OR o.lease_expires_at > $6)
ORDER BY o.created_at, o.operation_id
LIMIT $7;

-- name: list_unknown_operations
-- Reconciler list of unknown outcomes: stored unknown plus submitted whose lease has expired, unswept.
-- Two ordered index scans merged (Merge Append), so the page needs no sort of the whole set.
-- None of them is committed: no log_index (null in the view, as every read's view has it).
SELECT *, NULL::bigint AS log_index FROM (
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
-- Receipts feed: committed operations in feed position order after $2: ledger.feed's primary key in
-- order, each position's operation by its primary key (the OFFSET 0 keeps the LATERAL a parameterised
-- probe: a join the planner may turn into a hash of the tenant's operations and a sort, when its
-- statistics call the tenant small). since/until filter by resolution time; a tombstone keeps its
-- position but has no receipt to show.
-- log_index: the receipt's leaf once a signed checkpoint covers its position (API.md 14), so an
-- auditor following the feed maps each receipt to its leaf; the log's size read once a page.
SELECT o.*, clock_timestamp() AS db_now, f.feed_position,
       CASE WHEN f.feed_position <= (
           SELECT max(c.size) FROM ledger.log_checkpoints AS c WHERE c.tenant_id = $1)
       THEN f.feed_position - 1 END AS log_index
FROM ledger.feed AS f
CROSS JOIN LATERAL (
    SELECT o.* FROM ledger.operations AS o
    WHERE o.tenant_id = $1 AND o.operation_id = f.operation_id
      AND o.status = 'committed' AND o.receipt IS NOT NULL
      AND o.resolved_at >= $3 AND o.resolved_at < $4
      AND ($5::text IS NULL OR o.tool = $5)
      AND ($6::text IS NULL OR o.principal = $6)
    OFFSET 0
) AS o
WHERE f.tenant_id = $1 AND f.feed_position > $2
ORDER BY f.feed_position
LIMIT $7;

-- name: feed_lock
-- The tenant's feed counter, locked (created at 0 the first time): whoever holds it is the one
-- sequencer of the tenant. After waiting for another sequencer, DO UPDATE locks and returns the
-- newest committed value.
INSERT INTO ledger.feed_counters (tenant_id, last_position) VALUES ($1, 0)
ON CONFLICT (tenant_id) DO UPDATE SET last_position = ledger.feed_counters.last_position
RETURNING last_position;

-- name: feed_assign
-- Give the next positions after $2 to up to $3 committed operations waiting in ledger.feed_pending,
-- in resolution order: their pending rows deleted, their positions inserted in ledger.feed (the
-- operation's row is not written: migration 0019), the counter moved; runs after feed_lock in the same
-- transaction. Its snapshot is taken after the lock was granted, so it sees every position an earlier
-- sequencer committed, and it positions only commits it can see: a position is never handed out below
-- one already visible. Answers how many operations got a position.
-- The batch is a prefix of feed_pending's primary key, so it is deleted as one range of that key up
-- to its last row (the same snapshot sees the same rows), and numbered from what was deleted. A join
-- of the batch to the table instead was planned, on a table whose statistics said nothing yet, as a
-- nested loop rescanning the whole batch for every row: quadratic in the batch (tests/integration/
-- test_query_plans.py pins the range).
WITH batch AS (
    SELECT p.resolved_at, p.operation_id
    FROM ledger.feed_pending AS p
    WHERE p.tenant_id = $1
    ORDER BY p.resolved_at, p.operation_id
    LIMIT $3
), edge AS (
    SELECT b.resolved_at, b.operation_id FROM batch AS b
    ORDER BY b.resolved_at DESC, b.operation_id DESC
    LIMIT 1
), taken AS (
    DELETE FROM ledger.feed_pending AS p
    WHERE p.tenant_id = $1
      AND (p.resolved_at, p.operation_id)
          <= ((SELECT e.resolved_at FROM edge AS e), (SELECT e.operation_id FROM edge AS e))
    RETURNING p.resolved_at, p.operation_id
), placed AS (
    INSERT INTO ledger.feed (tenant_id, feed_position, operation_id)
    SELECT $1, $2::bigint + row_number() OVER (ORDER BY t.resolved_at, t.operation_id), t.operation_id
    FROM taken AS t
    RETURNING feed_position
)
UPDATE ledger.feed_counters AS c
SET last_position = GREATEST(c.last_position, (SELECT COALESCE(max(feed_position), 0) FROM placed))
WHERE c.tenant_id = $1
RETURNING (SELECT count(*) FROM placed) AS assigned;

-- name: operation_chain
-- One operation's row status, attempt and chain head beside each of its events in seq order, for
-- verification; the LEFT JOIN keeps an operation whose events were all removed (one row, NULL seq).
SELECT o.operation_id, o.status AS op_status, o.attempt AS op_attempt, o.chain_hash AS op_hash,
       o.purged_seq, o.purged_hash,
       e.seq, e.at, e.kind, e.actor, e.from_status, e.to_status, e.attempt, e.data, e.prev_hash, e.hash
FROM ledger.operations AS o
LEFT JOIN ledger.events AS e ON e.tenant_id = o.tenant_id AND e.operation_id = o.operation_id
WHERE o.tenant_id = $1 AND o.operation_id = $2
ORDER BY e.seq;

-- name: tenant_chains
-- Every operation of the tenant with its events, in (operation_id, seq) order, streamed by verify.
SELECT o.operation_id, o.status AS op_status, o.attempt AS op_attempt, o.chain_hash AS op_hash,
       o.purged_seq, o.purged_hash,
       e.seq, e.at, e.kind, e.actor, e.from_status, e.to_status, e.attempt, e.data, e.prev_hash, e.hash
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
-- (lock_purgeable locks them by tenant: Citus refuses FOR UPDATE across shards). Only committed and
-- not_applied rows that still hold their receipt or reason qualify: never pending, submitted, unknown,
-- or a tombstone.
SELECT tenant_id, operation_id
FROM ledger.operations
WHERE status IN ('committed', 'not_applied') AND (receipt IS NOT NULL OR not_applied_reason IS NOT NULL)
  AND updated_at < clock_timestamp() - make_interval(days => $1)
ORDER BY updated_at
LIMIT $2;

-- name: lock_purgeable
-- Lock those of one tenant's candidates that still qualify, with the receipt whose digest the tombstone
-- keeps; rows a request holds are skipped.
SELECT operation_id, receipt
FROM ledger.operations
WHERE tenant_id = $1 AND operation_id = ANY($2::text[])
  AND status IN ('committed', 'not_applied') AND (receipt IS NOT NULL OR not_applied_reason IS NOT NULL)
  AND updated_at < clock_timestamp() - make_interval(days => $3)
FOR UPDATE SKIP LOCKED;

-- name: tombstone_candidates
-- A batch of tombstones whose last change is older than TOMBSTONE_DAYS, across tenants, not locked here
-- (lock_expired_tombstones locks them by tenant).
SELECT tenant_id, operation_id
FROM ledger.operations
WHERE status IN ('committed', 'not_applied') AND receipt IS NULL AND not_applied_reason IS NULL
  AND updated_at < clock_timestamp() - make_interval(days => $1)
ORDER BY updated_at
LIMIT $2;

-- name: lock_expired_tombstones
-- Lock those of one tenant's expired-tombstone candidates that still qualify; held rows are skipped.
SELECT operation_id
FROM ledger.operations
WHERE tenant_id = $1 AND operation_id = ANY($2::text[])
  AND status IN ('committed', 'not_applied') AND receipt IS NULL AND not_applied_reason IS NULL
  AND updated_at < clock_timestamp() - make_interval(days => $3)
FOR UPDATE SKIP LOCKED;

-- name: unknown_backlog
-- Unknown outcomes across tenants (expired submitted ones included): how many, and the oldest's wait.
SELECT count(*) AS waiting,
       COALESCE(EXTRACT(EPOCH FROM clock_timestamp()
                - min(CASE WHEN status = 'unknown' THEN updated_at ELSE lease_expires_at END)), 0)::float8
           AS oldest_seconds
FROM ledger.operations
WHERE status = 'unknown' OR (status = 'submitted' AND lease_expires_at <= clock_timestamp());

-- name: purge_backlog
-- How far past its retention the oldest purgeable operation is, in seconds (0: purge keeps up).
SELECT COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - make_interval(days => $1) - min(updated_at)), 0)::float8
FROM ledger.operations
WHERE status IN ('committed', 'not_applied') AND updated_at < clock_timestamp() - make_interval(days => $1);

-- name: purge_mode
-- The events trigger allows DELETE only in a transaction that sets this (the purge path).
SELECT tenancy.bind_setting('effect_ledger.purge', 'on');

-- name: purge_events
-- Delete the events of one tenant's given operations, in the transaction that deletes or tombstones them
-- (no foreign key since migration 0016: this statement is what leaves no event without its operation).
DELETE FROM ledger.events
WHERE tenant_id = $1 AND operation_id = ANY($2::text[]);

-- name: tombstone_operations
-- Turn one tenant's given operations (locked by lock_purgeable in this transaction, so still terminal)
-- into tombstones: binding, status, attempt, times and chain head stay; the receipt body, reason, effect
-- reference and nonce material go; the receipt's digest and the chain point of the cut are kept.
-- updated_at is not touched: TOMBSTONE_DAYS counts from the same last change as RETENTION_DAYS.
-- statement_timestamp(), not clock_timestamp(): Citus refuses VOLATILE functions in an UPDATE.
UPDATE ledger.operations AS o SET
    receipt = NULL, not_applied_reason = NULL, effect_ref = NULL, client_nonce_hash = NULL,
    sealed_token = NULL, receipt_digest = d.receipt_digest, purged_at = statement_timestamp(),
    purged_seq = o.chain_seq, purged_hash = o.chain_hash
FROM unnest($2::text[], $3::text[]) AS d(operation_id, receipt_digest)
WHERE o.tenant_id = $1 AND o.operation_id = d.operation_id;

-- name: purge_operations
-- Delete one tenant's given operations (expired tombstones locked by lock_expired_tombstones in this
-- transaction): the ID is gone, and its feed position with it (the log keeps its leaf), or its place
-- in ledger.feed_pending when it never got one (nothing sequenced the tenant's feed for the whole
-- retention: the log off, no feed reader). A pending row left behind would later be given a position
-- with no operation behind it: a gap at which the log's integrator stops for good. The pending row is
-- found by its key (the operation's resolved_at); every CTE sees the operations before the DELETE.
WITH unpositioned AS (
    DELETE FROM ledger.feed WHERE tenant_id = $1 AND operation_id = ANY($2::text[])
), unqueued AS (
    DELETE FROM ledger.feed_pending AS p
    USING ledger.operations AS o
    WHERE o.tenant_id = $1 AND o.operation_id = ANY($2::text[])
      AND p.tenant_id = $1 AND p.resolved_at = o.resolved_at AND p.operation_id = o.operation_id
)
DELETE FROM ledger.operations
WHERE tenant_id = $1 AND operation_id = ANY($2::text[]);

-- ---------------------------------------------------------------------------------------------
-- Protected diagnostics (docs/api.md section 9). The runtime role inserts incidents but cannot read
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

-- name: store_report
-- Store a report that carries a report_id, once per (principal, report key): SECURITY DEFINER (0007),
-- answers the first incident's reference, whether this call stored it, and whether the fields match.
SELECT first_incident, stored, same_fields
FROM diagnostics.store_report($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15);

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
-- The run journal (API.md section 12): owned sessions and their records. Ownership is part of
-- every WHERE clause, so a session of another principal reads exactly like a missing one.

-- name: journal_create_session
-- A new session owned by the caller's tenant and principal, at revision 0.
INSERT INTO journal.sessions (tenant_id, session_id, principal, labels, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $5)
RETURNING session_id, revision, schema, created_at;

-- name: journal_lock_session
-- Lock the owner's session FOR UPDATE and read what an append is decided against: concurrent
-- appends at one revision queue here, and each sees the revision the one before it committed.
SELECT revision, causal, last_nonce_hash, last_base_revision, last_batch_digest
FROM journal.sessions
WHERE tenant_id = $1 AND session_id = $2 AND principal = $3
FOR UPDATE;

-- name: journal_append
-- Advance the revision and store the batch at seqs $3+1.. in one round trip (rows locked above);
-- `revision = $3` makes a stale write store nothing rather than interleave.
WITH advanced AS (
    UPDATE journal.sessions SET
        revision = $4, causal = $5, last_nonce_hash = $6, last_base_revision = $3,
        last_batch_digest = $7, updated_at = $8
    WHERE tenant_id = $1 AND session_id = $2 AND revision = $3
    RETURNING session_id
)
INSERT INTO journal.records (tenant_id, session_id, seq, record, schema, jcs_bytes, accepted_at)
SELECT $1, advanced.session_id, $3 + r.ord, r.record, r.schema, r.jcs_bytes, $8
FROM advanced, unnest($9::jsonb[], $10::integer[], $11::integer[]) WITH ORDINALITY AS r(record, schema, jcs_bytes, ord)
RETURNING seq;

-- name: journal_read_session
-- One session of the tenant, the owner's only unless $3 is NULL (an auditor reads any).
SELECT session_id, principal, revision, schema, labels, created_at, updated_at
FROM journal.sessions
WHERE tenant_id = $1 AND session_id = $2 AND ($3::text IS NULL OR principal = $3);

-- name: journal_read_records
-- The session's records after seq $3, in seq order (read in the session's snapshot).
SELECT seq, record, jcs_bytes, accepted_at
FROM journal.records
WHERE tenant_id = $1 AND session_id = $2 AND seq > $3
ORDER BY seq;

-- name: journal_effects
-- What the ledger says now about the operations a projection's calls name; reads, never locks. One
-- primary-key probe per operation, as log_receipts_of (on a table not analysed yet the array form
-- could scan the tenant's whole key range).
SELECT o.*, clock_timestamp() AS db_now
FROM (SELECT DISTINCT unnest($2::text[])) AS k(operation_id)
CROSS JOIN LATERAL (
    SELECT o.* FROM ledger.operations AS o
    WHERE o.tenant_id = $1 AND o.operation_id = k.operation_id
    OFFSET 0
) AS o;

-- name: journal_delete_session
-- Delete the owner's session; its records go with it (ON DELETE CASCADE). The ledger is not touched.
DELETE FROM journal.sessions
WHERE tenant_id = $1 AND session_id = $2 AND principal = $3
RETURNING session_id;

-- name: journal_idle_candidates
-- Up to $2 sessions unchanged for $1 days, across tenants (owner, maintenance scope), oldest first, not
-- locked here: journal_purge_idle locks and deletes them by tenant (Citus refuses FOR UPDATE across shards).
SELECT tenant_id, session_id
FROM journal.sessions
WHERE updated_at < clock_timestamp() - make_interval(days => $1)
ORDER BY updated_at
LIMIT $2;

-- name: journal_purge_idle
-- Delete those of one tenant's candidates that are still idle, with their records (ON DELETE CASCADE);
-- sessions an append holds are skipped, not waited for.
DELETE FROM journal.sessions
WHERE tenant_id = $1 AND session_id IN (
    SELECT session_id FROM journal.sessions
    WHERE tenant_id = $1 AND session_id = ANY($2::text[])
      AND updated_at < clock_timestamp() - make_interval(days => $3)
    FOR UPDATE SKIP LOCKED);

-- ---------------------------------------------------------------------------------------------
-- The verifiable receipts log (migration 0010, API.md section 14, docs/verifiable-log.md). The
-- integrator and checkpointer run as the owner, off the executor path; the runtime role only reads.

-- name: log_tenants_to_integrate
-- Tenants with committed receipts not yet in their log: waiting for a position (ledger.feed_pending),
-- or positioned beyond the log's size; across tenants (maintenance scope). At most $1, round robin: those
-- after $2 (the last tenant the previous pass took) first, then from the start.
SELECT tenant_id FROM (
    SELECT DISTINCT p.tenant_id FROM ledger.feed_pending AS p
    UNION
    SELECT c.tenant_id FROM ledger.feed_counters AS c
    LEFT JOIN ledger.log_state AS s ON s.tenant_id = c.tenant_id
    WHERE c.last_position > COALESCE(s.size, 0)
) AS t
ORDER BY tenant_id <= $2, tenant_id
LIMIT $1;

-- name: log_open
-- The tenant's log state row, created empty the first time (a concurrent creator wins silently).
INSERT INTO ledger.log_state (tenant_id, size, root, integrated_at)
VALUES ($1, 0, sha256(''::bytea), clock_timestamp())
ON CONFLICT (tenant_id) DO NOTHING;

-- name: log_lock
-- One writer per tenant: lock its log state row, or get nothing when another writer holds it.
SELECT size, root FROM ledger.log_state WHERE tenant_id = $1 FOR UPDATE SKIP LOCKED;

-- name: log_batch
-- The next committed receipts in feed order after the log's size (ledger.feed's primary key, each
-- operation probed by its own, as list_receipts), each with its chain's head event (the last by seq,
-- one backward probe of the events' primary key; NULLs for an operation without events): its columns
-- under an event's own names (seq, at, kind, actor, from_status, to_status, data, prev_hash, hash), so
-- the row is also the event domain/chain.event_holds and _records_receipt read, except its attempt,
-- head_attempt, beside the operation's; a tombstone keeps its position and its receipt digest, so its
-- leaf is built all the same.
-- commit_hash: the leaf's chain_hash, the hash of the event that committed it (0023; the chain head for
-- a row without one). op_hash, purged_seq, purged_hash: the chain's head and base. The integrator
-- checks the head event against the row: in a committed operation's usual chain it is the committing
-- event, its hash the row's chain_hash and commit_hash, and it records the receipt; it commits to the
-- events before it through its prev_hash. The row and its head come from one snapshot (until round 34
-- the heads were a statement of their own, log_batch_heads, a slice of 64 at a time: a purge or an
-- event committed between the two reads looked like an edit until the chain was read again; logcpu,
-- alternating, 16 rounds each way: ~1 - 3 us of Python and ~0.5 - 2.5 of PostgreSQL a receipt
-- less). Any other shape (a discrepancy after the commit, a purge base, a head that is not the
-- row's) is judged by log_batch_chains.
-- row_version: the row's xmin, the transaction that wrote this version of it (any UPDATE writes a new
-- one): the checkpointer's log_rows_changed compares it instead of the receipt (round 31).
-- The limit is taken on the feed, before any operation is probed (round 32): on a feed no analyse had
-- seen, the limit after the join was planned as a bitmap scan of every position after the log's size,
-- an operation probed for each, then a top-N sort; a backlog of n receipts cost each pass n probes
-- (logcpu's 6,000: 12 buffers and 13 us of PostgreSQL a receipt, against 3 and 4.5). An operation not
-- found leaves a gap in the positions either way, which the integrator refuses at that position.
SELECT o.*, f.feed_position, h.*
FROM (
    SELECT f.feed_position, f.operation_id
    FROM ledger.feed AS f
    WHERE f.tenant_id = $1 AND f.feed_position > $2
    ORDER BY f.feed_position
    LIMIT $3
) AS f
CROSS JOIN LATERAL (
    SELECT o.operation_id, o.principal, o.tool, o.tool_version, o.intent_digest, o.attempt, o.receipt,
           o.receipt_digest, COALESCE(o.commit_hash, o.chain_hash) AS commit_hash, o.resolved_at,
           o.purged_seq, o.purged_hash, o.chain_hash AS op_hash, o.xmin AS row_version
    FROM ledger.operations AS o
    WHERE o.tenant_id = $1 AND o.operation_id = f.operation_id AND o.status = 'committed'
    OFFSET 0
) AS o
LEFT JOIN LATERAL (
    SELECT e.seq, e.at, e.kind, e.actor, e.from_status, e.to_status, e.attempt AS head_attempt, e.data,
           e.prev_hash, e.hash
    FROM ledger.events AS e
    WHERE e.tenant_id = $1 AND e.operation_id = o.operation_id
    ORDER BY e.seq DESC
    LIMIT 1
) AS h ON true
ORDER BY f.feed_position;

-- name: log_tiles_get
-- Tiles (and entry bundles, level -1) of the tenant by (level, index).
SELECT t.level, t.idx, t.width, t.data
FROM ledger.log_tiles AS t
JOIN unnest($2::smallint[], $3::bigint[]) AS k(level, idx) ON t.level = k.level AND t.idx = k.idx
WHERE t.tenant_id = $1;

-- name: log_tile_put
-- Write one tile or bundle; a full one (width 256) is never written again.
INSERT INTO ledger.log_tiles (tenant_id, level, idx, width, data) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant_id, level, idx) DO UPDATE SET width = EXCLUDED.width, data = EXCLUDED.data
WHERE ledger.log_tiles.width < 256;

-- name: log_advance
-- Move the integrated tree to its new size and root (under log_lock). statement_timestamp(), not
-- clock_timestamp(): Citus refuses VOLATILE functions in an UPDATE of a distributed table.
UPDATE ledger.log_state SET size = $2, root = $3, integrated_at = statement_timestamp() WHERE tenant_id = $1;

-- name: log_states
-- Every tenant's integrated tree and its last checkpoint (maintenance scope), for the checkpointer.
SELECT tenant_id, size, root, signed_size, signed_at FROM ledger.log_state;

-- name: log_checkpoint_put
-- Keep a checkpoint the signer signed (a repeat of the same size changes nothing).
INSERT INTO ledger.log_checkpoints (tenant_id, size, root, note, signed_at)
VALUES ($1, $2, $3, $4, clock_timestamp())
ON CONFLICT (tenant_id, size) DO NOTHING;

-- name: log_signed
-- The tenant's latest checkpoint, noted on its log state row (under log_lock); statement_timestamp()
-- for Citus, as log_advance.
UPDATE ledger.log_state SET signed_size = $2, signed_at = statement_timestamp()
WHERE tenant_id = $1 AND (signed_size IS NULL OR signed_size < $2);

-- name: log_cosignatures_put
-- The witness cosignature lines collected for a checkpoint.
UPDATE ledger.log_checkpoints SET cosignatures = $3 WHERE tenant_id = $1 AND size = $2;

-- name: log_latest_checkpoint
-- The tenant's latest signed checkpoint.
SELECT size, root, note, cosignatures, signed_at
FROM ledger.log_checkpoints WHERE tenant_id = $1 ORDER BY size DESC LIMIT 1;

-- name: log_checkpoints_covering
-- The tenant's newest signed checkpoints (at most $3) that hold leaf index $2 - 1 (size >= feed position
-- $2), newest first: a proof goes against the first of them its witnesses' quorum cosigned. $4: only
-- those with cosignatures kept (a quorum is needed): a witness down for more than $3 checkpoints left
-- older receipts with none among the newest $3, and no proof, until round 24.
SELECT size, root, note, cosignatures
FROM ledger.log_checkpoints
WHERE tenant_id = $1 AND size >= $2 AND (NOT $4 OR COALESCE(cosignatures, '') <> '')
ORDER BY size DESC LIMIT $3;

-- name: log_checkpoint_at
-- The tenant's signed checkpoint of size $2 (GET /v1/log/consistency's `to`).
SELECT size, note FROM ledger.log_checkpoints WHERE tenant_id = $1 AND size = $2;

-- name: log_position
-- A committed operation's feed position (its leaf index + 1; NULL while it waits for one), or no row.
SELECT f.feed_position
FROM ledger.operations AS o
LEFT JOIN ledger.feed AS f ON f.tenant_id = o.tenant_id AND f.operation_id = o.operation_id
WHERE o.tenant_id = $1 AND o.operation_id = $2 AND o.status = 'committed';

-- name: log_decision_put
-- An operator's recorded decision about a log behind the signer (log-recover).
INSERT INTO ledger.log_decisions (tenant_id, decided_at, kind, signed_size, db_size, reason)
VALUES ($1, clock_timestamp(), $2, $3, $4, $5);

-- name: log_decisions_all
-- Every recorded decision (maintenance scope): the last one per tenant says which loss was accepted.
SELECT tenant_id, kind, signed_size, db_size, decided_at FROM ledger.log_decisions ORDER BY decided_at;

-- name: log_restore_tombstone
-- log-recover: re-create a committed tombstone for a logged receipt the database lost, at the feed
-- position the signed log gave it; an ID that exists again is left alone. Its chain starts at the
-- logged chain head, which is also its commit's hash.
WITH restored AS (
    INSERT INTO ledger.operations (
        tenant_id, operation_id, principal, tool, tool_version, intent_digest, status, attempt,
        claim_token_hash, lease_seconds, created_at, updated_at, resolved_at, resolved_by,
        chain_seq, chain_hash, purged_at, purged_seq, purged_hash, receipt_digest, commit_hash)
    VALUES ($1, $2, $3, $4, $5, $6, 'committed', $7, '\x00'::bytea, 1, $8, clock_timestamp(), $8,
            'log-recover', 0, $9, clock_timestamp(), 0, $9, $10, $9)
    ON CONFLICT (tenant_id, operation_id) DO NOTHING
    RETURNING operation_id
), placed AS (
    INSERT INTO ledger.feed (tenant_id, feed_position, operation_id)
    SELECT $1, $11, r.operation_id FROM restored AS r
)
SELECT operation_id FROM restored;

-- name: log_receipts_of
-- The current receipt facts of some operations, to check new leaves against before signing. One
-- primary-key probe per operation (the OFFSET 0 keeps the LATERAL a parameterised lookup), whatever
-- the statistics say: written as `operation_id = ANY($2)`, on a table not analysed yet (a new
-- deployment's first minute; a `repeat` round on a fresh database) the planner scanned the tenant's
-- whole primary-key range for each 64-operation slice and filtered the array (5.3 ms a slice at 7,700
-- operations, growing with the tenant; round 14). Only what the check compares (round 15: the other
-- leaf facts were decoded for every receipt and never read).
-- feed_position: a row at another position than the leaf's is another use of the ID, claimed anew after
-- the logged one expired (round 24).
SELECT o.*, f.feed_position
FROM (SELECT DISTINCT unnest($2::text[])) AS k(operation_id)
CROSS JOIN LATERAL (
    SELECT o.operation_id, o.receipt, o.receipt_digest, COALESCE(o.commit_hash, o.chain_hash) AS commit_hash
    FROM ledger.operations AS o
    WHERE o.tenant_id = $1 AND o.operation_id = k.operation_id AND o.status = 'committed'
    OFFSET 0
) AS o
LEFT JOIN ledger.feed AS f ON f.tenant_id = $1 AND f.operation_id = o.operation_id;

-- name: log_positioned_between
-- Committed operations holding feed positions in ($2, $3]: log-recover compares them with the mirror.
SELECT f.operation_id, f.feed_position
FROM ledger.feed AS f
JOIN ledger.operations AS o ON o.tenant_id = f.tenant_id AND o.operation_id = f.operation_id
WHERE f.tenant_id = $1 AND o.tenant_id = $1 AND o.status = 'committed'
  AND f.feed_position > $2 AND f.feed_position <= $3;

-- name: log_unposition
-- log-recover: free a feed position the mirror gives to another receipt; the operation, committed,
-- waits for a new one (re-sequenced after the recovered log). The re-queue is the CTE and the DELETE
-- the statement: the other way round (an INSERT ... SELECT joining the DELETE's RETURNING), Citus
-- refuses it as a distributed query nested in one on a shard (test_log_recover_positions.py).
WITH queued AS (
    INSERT INTO ledger.feed_pending (tenant_id, resolved_at, operation_id)
    SELECT o.tenant_id, o.resolved_at, o.operation_id
    FROM ledger.operations AS o
    WHERE o.tenant_id = $1 AND o.operation_id = $2 AND o.status = 'committed'
      AND EXISTS (SELECT 1 FROM ledger.feed AS f WHERE f.tenant_id = $1 AND f.operation_id = $2)
    ON CONFLICT DO NOTHING
)
DELETE FROM ledger.feed WHERE tenant_id = $1 AND operation_id = $2;

-- name: log_operation_state
-- log-recover: what the database has of an operation the mirror says was committed and logged.
SELECT o.status, f.feed_position
FROM ledger.operations AS o
LEFT JOIN ledger.feed AS f ON f.tenant_id = o.tenant_id AND f.operation_id = o.operation_id
WHERE o.tenant_id = $1 AND o.operation_id = $2;

-- name: log_position_set
-- log-recover: put a committed operation at the feed position the signed log gave it (no longer
-- waiting for one, if it was: its pending row found by its key, as purge_operations finds it).
WITH unqueued AS (
    DELETE FROM ledger.feed_pending AS p
    USING ledger.operations AS o
    WHERE o.tenant_id = $1 AND o.operation_id = $2
      AND p.tenant_id = $1 AND p.resolved_at = o.resolved_at AND p.operation_id = $2
)
INSERT INTO ledger.feed (tenant_id, feed_position, operation_id) VALUES ($1, $3, $2)
ON CONFLICT (tenant_id, operation_id) DO UPDATE SET feed_position = EXCLUDED.feed_position;

-- name: log_make_tombstone
-- log-recover: an operation the database has as not committed, whose commit the signed log proves:
-- it becomes the committed tombstone of that commit (its receipt digest and its leaf's chain hash, $6,
-- kept), never executable again. statement_timestamp() for Citus, as log_advance.
WITH made AS (
    UPDATE ledger.operations
    SET status = 'committed', receipt = NULL, not_applied_reason = NULL, lease_expires_at = NULL,
        receipt_digest = $3, commit_hash = $6, resolved_at = $5, resolved_by = 'log-recover',
        updated_at = statement_timestamp(), purged_at = statement_timestamp(), purged_seq = chain_seq,
        purged_hash = chain_hash
    WHERE tenant_id = $1 AND operation_id = $2
    RETURNING operation_id
)
INSERT INTO ledger.feed (tenant_id, feed_position, operation_id)
SELECT $1, $4, m.operation_id FROM made AS m
ON CONFLICT (tenant_id, operation_id) DO UPDATE SET feed_position = EXCLUDED.feed_position;

-- name: log_feed_catch_up
-- log-recover: the feed counter at least at the recovered log's size.
INSERT INTO ledger.feed_counters (tenant_id, last_position) VALUES ($1, $2)
ON CONFLICT (tenant_id) DO UPDATE SET last_position = GREATEST(ledger.feed_counters.last_position, $2);

-- name: log_rows_changed
-- Of some leaves the integrator of this process built (operation ID, the row_version log_batch read,
-- the feed position), those whose operation row is no longer that version of a committed row, or whose
-- feed position is another: the checkpointer compares these with their leaves in full
-- (log_receipts_of). A row that is still the version the integrator verified holds the receipt and
-- commit hash its leaf was built from; no receipt is read or digested again (round 31, logcpu,
-- alternating: the checkpoint's Python 9.0 / 8.4 -> 5.4 / 6.6 us a leaf, its backend's share within
-- the tool's 1.7 us resolution). One primary-key probe per operation and per feed row (the
-- OFFSET 0 keeps each LATERAL a parameterised lookup, as in log_receipts_of).
SELECT k.operation_id
FROM unnest($2::text[], $3::xid[], $4::bigint[]) AS k(operation_id, row_version, feed_position)
LEFT JOIN LATERAL (
    SELECT o.xmin AS row_version
    FROM ledger.operations AS o
    WHERE o.tenant_id = $1 AND o.operation_id = k.operation_id AND o.status = 'committed'
    OFFSET 0
) AS o ON true
LEFT JOIN LATERAL (
    SELECT f.feed_position
    FROM ledger.feed AS f
    WHERE f.tenant_id = $1 AND f.operation_id = k.operation_id
    OFFSET 0
) AS f ON true
WHERE o.row_version IS DISTINCT FROM k.row_version OR f.feed_position IS DISTINCT FROM k.feed_position;

-- name: log_batch_chains
-- The operations of an integration batch whose events did not lead to the head log_batch read, with
-- their events (a row with a NULL seq for one that has none), read again together: a purge since is
-- told from an edit by the row, and each chain is recomputed from the row read now (until round 29
-- every operation of every batch was read this way). One primary-key probe per operation and per operation's events, whatever the statistics
-- say (the OFFSET 0 keeps each LATERAL a parameterised lookup): written as one join, on a table whose
-- statistics lagged behind its growth (a new deployment), the planner hashed every event of the tenant
-- for each 64-operation slice (5.5 ms against 1.1 ms at 9,300 events, and growing with the tenant).
-- Unordered: the caller groups the rows by operation and orders each chain by seq. A sort here copied
-- every wide row (the events' data) before the first one left: ~5 of ~25 us of the backend's CPU a
-- receipt (round 19, 3,000 receipts in slices of 64).
SELECT o.operation_id, o.status AS op_status, o.attempt AS op_attempt, o.chain_hash AS op_hash,
       o.purged_seq, o.purged_hash,
       e.seq, e.at, e.kind, e.actor, e.from_status, e.to_status, e.attempt, e.data, e.prev_hash, e.hash
FROM (SELECT DISTINCT unnest($2::text[])) AS k(operation_id)
CROSS JOIN LATERAL (
    SELECT o.operation_id, o.status, o.attempt, o.chain_hash, o.purged_seq, o.purged_hash
    FROM ledger.operations AS o
    WHERE o.tenant_id = $1 AND o.operation_id = k.operation_id
    OFFSET 0
) AS o
LEFT JOIN LATERAL (
    SELECT e.seq, e.at, e.kind, e.actor, e.from_status, e.to_status, e.attempt, e.data, e.prev_hash, e.hash
    FROM ledger.events AS e
    WHERE e.tenant_id = $1 AND e.operation_id = o.operation_id
    OFFSET 0
) AS e ON true;

-- Approvals (docs/api.md section 15, migration 0011). The gate runs inside run_claim; decide and
-- revoke are one statement each; reads keep their tenant transaction.

-- name: run_approval_decide
-- An approver's decision on one request, in one round trip.
SELECT c.outcome, c.events, c.db_now, to_jsonb(c.approval) AS approval
FROM ledger.approval_decide($1, $2, $3, $4, $5) AS c;

-- name: run_approval_revoke
-- Revoke one request, in one round trip.
SELECT c.outcome, c.events, c.db_now, to_jsonb(c.approval) AS approval
FROM ledger.approval_revoke($1, $2, $3, $4) AS c;

-- name: read_approval
-- One approval request of the tenant, with the database clock (its effective status needs it).
SELECT a.*, clock_timestamp() AS db_now
FROM ledger.approvals AS a
WHERE a.tenant_id = $1 AND a.approval_id = $2;

-- name: list_approvals
-- Approval requests, oldest first, keyset-paginated by (requested_at, approval_id). $2: statuses as
-- stored (the caller maps effective statuses: a live request past expires_at is `expired`), NULL for
-- all; $3: only live ones past (true) or before (false) their expiry, NULL for both.
SELECT a.*, clock_timestamp() AS db_now
FROM ledger.approvals AS a
WHERE a.tenant_id = $1
  AND ($2::text[] IS NULL OR a.status = ANY($2::text[]))
  AND ($3::boolean IS NULL OR (a.expires_at <= clock_timestamp()) = $3::boolean)
  AND ($4::timestamptz IS NULL OR (a.requested_at, a.approval_id) > ($4::timestamptz, $5::text))
ORDER BY a.requested_at, a.approval_id
LIMIT $6;

-- name: list_approval_events
-- One request's events in chain order.
SELECT seq, at, kind, actor, data, prev_hash, hash, approval_id
FROM ledger.approval_events
WHERE tenant_id = $1 AND approval_id = $2
ORDER BY seq;

-- name: expire_approvals
-- Maintenance, one tenant: record the expiry (an `expired` event) of live requests past expires_at.
SELECT ledger.expire_approvals($1, $2);

-- name: approval_expiry_tenants
-- Maintenance, across tenants: tenants with live approval requests past their expiry.
SELECT DISTINCT tenant_id FROM ledger.approvals
WHERE status IN ('pending', 'approved', 'denied') AND expires_at <= clock_timestamp();

-- name: purge_approval_intents
-- Retention: drop the stored intent of requests past their validity, or consumed or revoked; the
-- digest stays. statement_timestamp(): Citus refuses VOLATILE functions in an UPDATE.
UPDATE ledger.approvals SET intent = NULL
WHERE intent IS NOT NULL AND (expires_at <= statement_timestamp() OR status IN ('consumed', 'revoked'));

-- ---------------------------------------------------------------------------------------------
-- Continuation payloads (docs/api.md section 12, migration 0012): sealed with a key outside the
-- database, stored apart from their record, read only by context replay.

-- name: journal_prefix_records
-- The stored records 1..$3 of a session in seq order (the prefix a continuation is bound to).
SELECT seq, record
FROM journal.records
WHERE tenant_id = $1 AND session_id = $2 AND seq <= $3
ORDER BY seq;

-- name: journal_store_payloads
-- The sealed payloads of a batch's continuation records, joined to their records (just inserted: the
-- foreign key). Selecting from journal.records on the tenant keeps it one co-located shard on Citus,
-- which refuses an INSERT ... SELECT from a function alone into a table with row-level security.
INSERT INTO journal.continuation_payloads (tenant_id, session_id, seq, key_id, nonce, ciphertext, expires_at)
SELECT r.tenant_id, r.session_id, r.seq, p.key_id, p.nonce, p.ciphertext, p.expires_at
FROM journal.records AS r
JOIN unnest($3::integer[], $4::text[], $5::bytea[], $6::bytea[], $7::timestamptz[])
    AS p(seq, key_id, nonce, ciphertext, expires_at) ON p.seq = r.seq
WHERE r.tenant_id = $1 AND r.session_id = $2;

-- name: journal_read_payload
-- One continuation's sealed payload, unless it has expired by the database clock.
SELECT key_id, nonce, ciphertext
FROM journal.continuation_payloads
WHERE tenant_id = $1 AND session_id = $2 AND seq = $3 AND expires_at > clock_timestamp();

-- name: journal_purge_payloads
-- Retention (owner, maintenance scope): payloads past their expiry; their records (metadata) stay.
DELETE FROM journal.continuation_payloads
WHERE expires_at <= statement_timestamp();
