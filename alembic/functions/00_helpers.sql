-- The write path's shared pieces (docs/write-path.md). Applied by migration 0009 and by every later
-- migration that changes one of alembic/functions/*.sql (effect_ledger.db.migrate.apply_functions).
-- These are small SQL expressions that the planner inlines into the calling statement, plus
-- ledger.append_event, the one place an event is hashed and inserted.

-- RFC 3339 UTC with milliseconds, as domain/timefmt.format_ts writes it (values are stored truncated).
CREATE OR REPLACE FUNCTION ledger.ts_text(t timestamptz) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
$$;

-- A JSON string (or null) in JCS form: to_json(text) escapes exactly as JCS does (short escapes for
-- \b \t \n \f \r \" \\, \u00xx lowercase for other controls, everything else literal). STABLE like
-- to_json itself, so that the planner may inline it (an IMMUTABLE wrapper of a STABLE body is not).
CREATE OR REPLACE FUNCTION ledger.jcs_string(s text) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT COALESCE(to_json(s)::text, 'null')
$$;

-- Bind the tenant for this transaction. On plain PostgreSQL set_config(); on Citus (its settings
-- exist) tenancy.bind_setting, whose SET LOCAL the coordinator forwards to the workers (0008).
-- LANGUAGE sql and VOLATILE like its body, so that the planner inlines it into the caller's expression.
-- The write-path functions assign its result (`bound := ledger.bind_tenant(tenant)`) rather than
-- PERFORM it: an assignment is a simple expression that PL/pgSQL evaluates directly, a PERFORM a whole
-- query through SPI (executor start and end) in every call.
CREATE OR REPLACE FUNCTION ledger.bind_tenant(tenant text) RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN current_setting('citus.propagate_set_commands', true) IS NULL
                THEN set_config('effect_ledger.tenant', tenant, true)
                ELSE tenancy.bind_setting('effect_ledger.tenant', tenant)::text END
$$;

-- The chain: hash = sha256_hex(prev_hash || "\n" || JCS(content)), exactly as domain/chain.py does.
-- The content's keys are written in JCS (sorted) order into one format() string; `data` comes in JCS
-- text (the service passes client-supplied parts already canonical). `at` needs no escaping. One
-- format() call, not a chain of `||`: each `||` is a function node that PL/pgSQL initialises again in
-- every transaction (fmgr lookup, ACL check), and the chain of 20 cost ~0.1 M instructions per cycle
-- (issue 20 item 1, round 3). format('%s', integer) writes what integer::text writes.
CREATE OR REPLACE FUNCTION ledger.event_hash(
    prev_hash text, operation_id text, seq integer, at timestamptz, kind text, actor text,
    from_status text, to_status text, attempt integer, data text)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT encode(sha256(convert_to(format(
        E'%s\n{"actor":%s,"at":"%s","attempt":%s,"data":%s,"from_status":%s,"kind":%s,"operation_id":%s,"seq":%s,"to_status":%s}',
        prev_hash, ledger.jcs_string(actor), ledger.ts_text(at), attempt, data, ledger.jcs_string(from_status),
        ledger.jcs_string(kind), ledger.jcs_string(operation_id), seq, ledger.jcs_string(to_status)), 'UTF8')), 'hex')
$$;

-- An event of a hot transition (claimed, submitted, completed) as the write-path functions answer it
-- (their `events` output): what the service reads of it (db/ledger.returned_events: the metrics count
-- events by kind and statuses, a span records the attempt), not its actor and data, nor the stored
-- row's seq, at and hashes (GET .../events serves those). Inlined into the caller's expression. Each key
-- costs: building the answer was 0.24 M instructions per cycle with all ten (issue 20 item 1, round 3);
-- the completed event's data is the whole receipt, which the answer's `op` carries already (round 23).
-- The cold transitions answer ledger.append_event's whole event (a discrepancy's `source` is counted).
CREATE OR REPLACE FUNCTION ledger.event_json(kind text, from_status text, to_status text, attempt integer)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object('kind', kind, 'from_status', from_status, 'to_status', to_status, 'attempt', attempt)
$$;

-- Append one event after the chain head (seq, prev_hash) of an operation whose row exists and is
-- locked by the caller; answers the event (its hash is the new head). The cold transitions use it
-- (reclaim, discrepancy, lease expiry, resolve, sweep); submit, complete and a new claim insert their
-- events inline, without the nested call.
-- INSERT ... VALUES, not INSERT ... SELECT FROM a function: Citus routes the former to the tenant's
-- shard (0008).
CREATE OR REPLACE FUNCTION ledger.append_event(
    tenant text, operation_id text, seq integer, prev_hash text, at timestamptz, kind text, actor text,
    from_status text, to_status text, attempt integer, data text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    digest constant text := ledger.event_hash(
        prev_hash, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data);
    body constant jsonb := data::jsonb;
BEGIN
    INSERT INTO ledger.events (
        tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
    VALUES (tenant, operation_id, seq, at, kind, actor, from_status, to_status, attempt, body, prev_hash, digest);
    -- The answer's keys and the stored row's seq, at and hashes: the cold transitions chain the next
    -- event (and the row's head) from this one's `seq` and `hash`.
    RETURN jsonb_build_object('seq', seq, 'at', at, 'kind', kind, 'actor', actor, 'from_status', from_status,
        'to_status', to_status, 'attempt', attempt, 'data', body, 'prev_hash', prev_hash, 'hash', digest);
END
$$;

-- The `lease_expired` event's data, and the `submitted` event's.
CREATE OR REPLACE FUNCTION ledger.lease_data(lease_expires_at timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT '{"lease_expires_at":' || ledger.jcs_string(ledger.ts_text(lease_expires_at)) || '}'
$$;
CREATE OR REPLACE FUNCTION ledger.submitted_data(effect_ref text, lease_expires_at timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT '{"effect_ref":' || ledger.jcs_string(effect_ref)
        || ',"lease_expires_at":' || ledger.jcs_string(ledger.ts_text(lease_expires_at)) || '}'
$$;

-- A settlement's event data (complete, resolve): keys in JCS order, absent parts left out.
CREATE OR REPLACE FUNCTION ledger.settled_data(
    outcome text, receipt text, reason text, evidence text, incident text)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT '{' || COALESCE('"evidence":' || evidence || ',', '') || COALESCE('"incident":' || to_json(incident)::text || ',', '')
        || '"outcome":' || ledger.jcs_string(outcome) || COALESCE(',"reason":' || reason, '')
        || COALESCE(',"receipt":' || receipt, '') || '}'
$$;

-- A discrepancy's event data: a report that disagrees with the recorded outcome.
CREATE OR REPLACE FUNCTION ledger.discrepancy_data(
    recorded text, reported text, receipt text, reason text, source text)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT '{"recorded_outcome":' || ledger.jcs_string(recorded) || ',"reported_outcome":' || ledger.jcs_string(reported)
        || COALESCE(',"reported_reason":' || reason, '') || COALESCE(',"reported_receipt":' || receipt, '')
        || ',"source":' || ledger.jcs_string(source) || '}'
$$;

-- Whether a report repeats what a terminal operation records: `unresolved` claims no outcome; a
-- tombstone (receipt and reason purged) agrees on its outcome alone; a receipt agrees on its content.
-- The four content members compared one by one, with no subquery: a SQL function with one is never
-- inlined, and PostgreSQL parses and plans its body again on every call from a PL/pgSQL expression
-- (0.39 M instructions a repeated complete until round 23, migration 0022).
CREATE OR REPLACE FUNCTION ledger.same_outcome(o ledger.operations, outcome text, receipt jsonb, reason jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT outcome = 'unresolved' OR (outcome = o.status AND CASE
        WHEN o.receipt IS NULL AND o.not_applied_reason IS NULL THEN true  -- a tombstone
        WHEN o.status = 'committed' THEN
            COALESCE(o.receipt -> 'external_ref', 'null') = COALESCE(receipt -> 'external_ref', 'null')
            AND COALESCE(o.receipt -> 'result_digest', 'null') = COALESCE(receipt -> 'result_digest', 'null')
            AND COALESCE(o.receipt -> 'result', 'null') = COALESCE(receipt -> 'result', 'null')
            AND COALESCE(o.receipt -> 'observed_at', 'null') = COALESCE(receipt -> 'observed_at', 'null')
        ELSE o.not_applied_reason IS NOT DISTINCT FROM reason
    END)
$$;
