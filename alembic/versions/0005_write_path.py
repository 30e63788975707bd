"""The write path in one round trip: one server-side function per command.

claim (optionally with submit), submit, heartbeat, complete and resolve each run as one statement in
autocommit: the function binds the tenant for its own transaction (set_config(..., true)), locks and
reads the row, applies the guards of API.md sections 6-7, writes the state, and appends the
hash-chained events. Row-level security stays forced underneath: the functions are SECURITY INVOKER,
run as the runtime role, and see only the tenant they bound. The rules are the ones of
domain/claims.py and domain/transitions.py; tests/integration/test_write_path_rules.py runs both over
every state x command case and compares state, events and answers.

Events are hashed here exactly as domain/chain.py does: sha256_hex(prev_hash + "\\n" + JCS(content)).
The content's keys are written in JCS order by concatenation; strings go through to_json(text), whose
escaping is JCS's (short escapes for \\b \\t \\n \\f \\r \\" \\\\, \\u00xx lowercase for other controls,
everything else literal); the service passes the client-supplied parts (receipt, reason, evidence)
already in JCS text.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from effect_ledger.db.migrate import execute_script

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

WRITE_PATH = r"""
-- RFC 3339 UTC with milliseconds, as domain/timefmt.format_ts writes it (values are stored truncated).
CREATE FUNCTION ledger.ts_text(t timestamptz) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
$$;

-- A JSON string (or null) in JCS form.
CREATE FUNCTION ledger.jcs_string(s text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT COALESCE(to_json(s)::text, 'null')
$$;

-- Whether a submitted operation's lease has run out at clock `at` (it is then unknown in effect).
CREATE FUNCTION ledger.effective_status(o ledger.operations, clock timestamptz)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN o.status = 'submitted' AND NOT COALESCE(o.lease_expires_at > clock, false)
                THEN 'unknown' ELSE o.status END
$$;

-- Number and hash one event onto the operation's chain head (moving the head), and queue it in
-- `events` (written by ledger.write_change). `data` is the event's data in JCS text.
CREATE PROCEDURE ledger.chain_event(
    INOUT o ledger.operations, INOUT events jsonb, event_at timestamptz, kind text, actor text,
    from_status text, to_status text, data text)
LANGUAGE plpgsql AS $$
DECLARE
    seq integer := o.chain_seq + 1;
    content text := '{"actor":' || ledger.jcs_string(actor) || ',"at":' || ledger.jcs_string(ledger.ts_text(event_at))
        || ',"attempt":' || o.attempt::text || ',"data":' || data
        || ',"from_status":' || ledger.jcs_string(from_status) || ',"kind":' || ledger.jcs_string(kind)
        || ',"operation_id":' || ledger.jcs_string(o.operation_id) || ',"seq":' || seq::text
        || ',"to_status":' || ledger.jcs_string(to_status) || '}';
    digest text := encode(sha256(convert_to(o.chain_hash || E'\n' || content, 'UTF8')), 'hex');
BEGIN
    events := events || jsonb_build_object(
        'seq', seq, 'at', event_at, 'kind', kind, 'actor', actor, 'from_status', from_status,
        'to_status', to_status, 'attempt', o.attempt, 'data', data::jsonb, 'prev_hash', o.chain_hash,
        'hash', digest);
    o.chain_seq := seq;
    o.chain_hash := digest;
END
$$;

-- Append queued events (after the operation row exists or was updated: the foreign key).
CREATE FUNCTION ledger.append_events(o ledger.operations, events jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger.events (
        tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
    SELECT o.tenant_id, o.operation_id, e.seq, e.at, e.kind, e.actor, e.from_status, e.to_status,
           e.attempt, e.data, e.prev_hash, e.hash
    FROM jsonb_to_recordset(events) AS e(
        seq integer, at timestamptz, kind text, actor text, from_status text, to_status text,
        attempt integer, data jsonb, prev_hash text, hash text);
END
$$;

-- Write an operation's new state and chain head, then its queued events.
CREATE FUNCTION ledger.write_change(o ledger.operations, events jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ledger.operations AS t SET
        (status, attempt, claim_token_hash, client_nonce_hash, sealed_token, lease_seconds,
         lease_expires_at, effect_ref, receipt, not_applied_reason, updated_at, submitted_at,
         resolved_at, resolved_by, chain_seq, chain_hash)
      = (o.status, o.attempt, o.claim_token_hash, o.client_nonce_hash, o.sealed_token, o.lease_seconds,
         o.lease_expires_at, o.effect_ref, o.receipt, o.not_applied_reason, o.updated_at, o.submitted_at,
         o.resolved_at, o.resolved_by, o.chain_seq, o.chain_hash)
    WHERE t.tenant_id = o.tenant_id AND t.operation_id = o.operation_id;
    IF jsonb_array_length(events) > 0 THEN
        PERFORM ledger.append_events(o, events);
    END IF;
END
$$;

-- pending -> submitted at `now` (claim-and-submit and submit): lease renewed, `submitted` event.
CREATE PROCEDURE ledger.submit_state(
    INOUT o ledger.operations, INOUT events jsonb, now timestamptz, effect_ref text, lease_seconds integer)
LANGUAGE plpgsql AS $$
BEGIN
    o.status := 'submitted';
    o.effect_ref := effect_ref;
    o.lease_seconds := COALESCE(lease_seconds, o.lease_seconds);
    o.lease_expires_at := now + make_interval(secs => o.lease_seconds);
    o.submitted_at := now;
    o.updated_at := now;
    CALL ledger.chain_event(o, events, now, 'submitted', o.principal, 'pending', 'submitted',
        '{"effect_ref":' || ledger.jcs_string(effect_ref)
        || ',"lease_expires_at":' || ledger.jcs_string(ledger.ts_text(o.lease_expires_at)) || '}');
END
$$;

-- A submitted operation whose lease has run out becomes unknown, with its `lease_expired` event.
CREATE PROCEDURE ledger.expire_if_due(INOUT o ledger.operations, INOUT events jsonb, clock timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    now timestamptz := date_trunc('milliseconds', clock);
BEGIN
    IF ledger.effective_status(o, clock) = 'unknown' AND o.status = 'submitted' THEN
        o.status := 'unknown';
        o.updated_at := now;
        CALL ledger.chain_event(o, events, now, 'lease_expired', 'effect-ledger', 'submitted', 'unknown',
            '{"lease_expires_at":' || ledger.jcs_string(ledger.ts_text(o.lease_expires_at)) || '}');
    END IF;
END
$$;

-- What a claim of an existing operation gets at `clock` (domain/claims.decide_claim).
CREATE FUNCTION ledger.claim_verdict(
    o ledger.operations, principal text, tool text, tool_version text, intent_digest text,
    nonce_hash bytea, clock timestamptz)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN (o.principal, o.tool, o.tool_version, o.intent_digest)
             IS DISTINCT FROM (principal, tool, tool_version, intent_digest) THEN 'intent_conflict'
        WHEN o.status = 'committed' THEN 'reuse_receipt'
        WHEN o.status IN ('pending', 'submitted') AND COALESCE(o.lease_expires_at > clock, false) THEN
            CASE WHEN nonce_hash IS NOT NULL AND o.client_nonce_hash = nonce_hash THEN 'replay'
                 ELSE 'operation_in_progress' END
        WHEN o.status NOT IN ('pending', 'not_applied') THEN 'outcome_unknown'
        ELSE 'new_attempt'
    END
$$;

-- A fresh attempt's state at `now`: pending, new token and lease, no outcome (domain/claims).
CREATE PROCEDURE ledger.fresh_attempt(
    INOUT o ledger.operations, now timestamptz, lease_seconds integer, nonce_hash bytea,
    token_hash bytea, sealed_token bytea)
LANGUAGE plpgsql AS $$
BEGIN
    o.status := 'pending';
    o.claim_token_hash := token_hash;
    o.client_nonce_hash := nonce_hash;
    o.sealed_token := sealed_token;
    o.lease_seconds := lease_seconds;
    o.lease_expires_at := now + make_interval(secs => lease_seconds);
    o.effect_ref := NULL;
    o.receipt := NULL;
    o.not_applied_reason := NULL;
    o.updated_at := now;
    o.submitted_at := NULL;
    o.resolved_at := NULL;
    o.resolved_by := NULL;
END
$$;

-- Claim (API.md section 6), optionally submitting in the same transaction. One statement:
-- INSERT ... ON CONFLICT DO NOTHING learns who won (it waits for a concurrent inserter); a loser
-- reads the row without a lock and decides; only a new attempt locks the row and decides again.
-- outcome: created | new_attempt | replay | reuse_receipt | a refusal code | vanished.
CREATE FUNCTION ledger.claim(
    tenant text, operation_id text, principal text, tool text, tool_version text, intent_digest text,
    lease_seconds integer, nonce_hash bytea, token_hash bytea, sealed_token bytea, submit boolean,
    effect_ref text,
    OUT outcome text, OUT op ledger.operations, OUT db_now timestamptz, OUT events jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    now timestamptz;
    won boolean;
BEGIN
    PERFORM set_config('effect_ledger.tenant', tenant, true);
    FOR round IN 1..3 LOOP
        events := '[]';
        db_now := clock_timestamp();
        now := date_trunc('milliseconds', db_now);
        op := NULL;
        op.tenant_id := tenant;
        op.operation_id := operation_id;
        op.principal := principal;
        op.tool := tool;
        op.tool_version := tool_version;
        op.intent_digest := intent_digest;
        op.attempt := 1;
        op.created_at := now;
        op.chain_seq := 0;
        op.chain_hash := repeat('0', 64);  -- the genesis hash: `claimed` is seq 1
        CALL ledger.fresh_attempt(op, now, lease_seconds, nonce_hash, token_hash, sealed_token);
        CALL ledger.chain_event(op, events, now, 'claimed', principal, NULL, 'pending',
            '{"lease_expires_at":' || ledger.jcs_string(ledger.ts_text(op.lease_expires_at)) || '}');
        IF submit THEN
            CALL ledger.submit_state(op, events, now, effect_ref, NULL);
        END IF;
        won := false;
        INSERT INTO ledger.operations SELECT op.* ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING;
        -- Who won: the row holds our (random) token hash only if our insert made it. Not RETURNING ...
        -- INTO nor FOUND: on a Citus worker (the call delegated there) the skipped row is still counted.
        won := EXISTS (SELECT 1 FROM ledger.operations AS o
                       WHERE o.tenant_id = claim.tenant AND o.operation_id = claim.operation_id
                         AND o.claim_token_hash = claim.token_hash);
        IF won THEN
            PERFORM ledger.append_events(op, events);
            outcome := 'created';
            RETURN;
        END IF;
        events := '[]';
        SELECT * INTO op FROM ledger.operations AS o
        WHERE o.tenant_id = claim.tenant AND o.operation_id = claim.operation_id;
        CONTINUE WHEN NOT FOUND;  -- purged since our insert conflicted: insert again
        db_now := clock_timestamp();
        outcome := ledger.claim_verdict(op, principal, tool, tool_version, intent_digest, nonce_hash, db_now);
        IF outcome = 'new_attempt' THEN
            -- decide again under the row lock: someone may have moved it since the unlocked read
            SELECT * INTO op FROM ledger.operations AS o
            WHERE o.tenant_id = claim.tenant AND o.operation_id = claim.operation_id
            FOR UPDATE;
            CONTINUE WHEN NOT FOUND;
            db_now := clock_timestamp();
            outcome := ledger.claim_verdict(op, principal, tool, tool_version, intent_digest, nonce_hash, db_now);
        END IF;
        IF outcome <> 'new_attempt' THEN
            RETURN;
        END IF;
        now := date_trunc('milliseconds', db_now);
        DECLARE
            previous_status text := op.status;
            previous_attempt integer := op.attempt;
        BEGIN
            op.attempt := op.attempt + 1;
            CALL ledger.fresh_attempt(op, now, lease_seconds, nonce_hash, token_hash, sealed_token);
            CALL ledger.chain_event(op, events, now, 'reclaimed', principal, previous_status, 'pending',
                '{"lease_expires_at":' || ledger.jcs_string(ledger.ts_text(op.lease_expires_at))
                || ',"previous_attempt":' || previous_attempt::text || '}');
        END;
        IF submit THEN
            CALL ledger.submit_state(op, events, now, effect_ref, NULL);
        END IF;
        PERFORM ledger.write_change(op, events);
        RETURN;
    END LOOP;
    outcome := 'vanished';
    op := NULL;
END
$$;

-- Bind the tenant for this transaction, then lock one operation and read it (NULL when there is
-- none, or it is another tenant's). Callers read the clock after this returns: after the lock.
CREATE FUNCTION ledger.lock_operation(tenant text, operation_id text) RETURNS ledger.operations
LANGUAGE plpgsql AS $$
DECLARE
    o ledger.operations;
BEGIN
    PERFORM set_config('effect_ledger.tenant', tenant, true);
    SELECT * INTO o FROM ledger.operations AS t
    WHERE t.tenant_id = lock_operation.tenant AND t.operation_id = lock_operation.operation_id
    FOR UPDATE;
    RETURN o;
END
$$;

-- The refusals every fenced call shares: a stale token, then an unknown or terminal operation.
CREATE FUNCTION ledger.refuse_unusable(o ledger.operations, token_hash bytea, clock timestamptz,
                                       usable text[])
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN o.claim_token_hash IS DISTINCT FROM token_hash THEN 'stale_claim'
        WHEN ledger.effective_status(o, clock) = ANY (usable) THEN NULL
        WHEN ledger.effective_status(o, clock) = 'unknown' THEN 'outcome_unknown'
        ELSE 'invalid_transition'
    END
$$;

-- Submit: pending -> submitted, lease renewed; a repeat while submitted changes nothing.
-- outcome: submitted | unchanged | not_found | a refusal code.
CREATE FUNCTION ledger.submit(
    tenant text, operation_id text, token_hash bytea, effect_ref text, lease_seconds integer,
    OUT outcome text, OUT op ledger.operations, OUT db_now timestamptz, OUT events jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    events := '[]';
    op := ledger.lock_operation(tenant, operation_id);
    db_now := clock_timestamp();
    IF op.tenant_id IS NULL THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    outcome := ledger.refuse_unusable(op, token_hash, db_now, ARRAY['pending', 'submitted']);
    IF outcome IS NOT NULL THEN
        RETURN;
    END IF;
    IF ledger.effective_status(op, db_now) = 'submitted' THEN
        outcome := CASE WHEN effect_ref IS NULL OR effect_ref = op.effect_ref
                        THEN 'unchanged' ELSE 'invalid_transition' END;
        RETURN;
    END IF;
    CALL ledger.submit_state(op, events, date_trunc('milliseconds', db_now), effect_ref, lease_seconds);
    PERFORM ledger.write_change(op, events);
    outcome := 'submitted';
END
$$;

-- Heartbeat: a pending or live submitted lease runs to now + lease_seconds (default: the attempt's).
-- outcome: extended | not_found | a refusal code.
CREATE FUNCTION ledger.heartbeat(
    tenant text, operation_id text, token_hash bytea, lease_seconds integer,
    OUT outcome text, OUT op ledger.operations, OUT db_now timestamptz, OUT events jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    now timestamptz;
BEGIN
    events := '[]';
    op := ledger.lock_operation(tenant, operation_id);
    db_now := clock_timestamp();
    IF op.tenant_id IS NULL THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    outcome := ledger.refuse_unusable(op, token_hash, db_now, ARRAY['pending', 'submitted']);
    IF outcome IS NOT NULL THEN
        RETURN;
    END IF;
    now := date_trunc('milliseconds', db_now);
    op.lease_expires_at := now + make_interval(secs => COALESCE(lease_seconds, op.lease_seconds));
    op.updated_at := now;
    PERFORM ledger.write_change(op, events);
    outcome := 'extended';
END
$$;

-- Whether a report repeats what a terminal operation records (domain/transitions.same_outcome).
CREATE FUNCTION ledger.same_outcome(o ledger.operations, outcome text, receipt jsonb, reason jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT outcome = o.status AND CASE
        WHEN o.status = 'committed' THEN (
            SELECT bool_and(COALESCE(o.receipt -> k, 'null') = COALESCE(receipt -> k, 'null'))
            FROM unnest(ARRAY['external_ref', 'result_digest', 'result', 'observed_at']) AS k)
        ELSE o.not_applied_reason IS NOT DISTINCT FROM reason
    END
$$;

-- A report that disagrees with the recorded outcome: the disagreement is recorded as an event.
CREATE PROCEDURE ledger.record_discrepancy(
    INOUT o ledger.operations, INOUT events jsonb, clock timestamptz, actor text, source text,
    outcome text, receipt text, reason text)
LANGUAGE plpgsql AS $$
DECLARE
    status text := ledger.effective_status(o, clock);
BEGIN
    CALL ledger.chain_event(o, events, date_trunc('milliseconds', clock), 'discrepancy', actor, status, status,
        '{"recorded_outcome":' || ledger.jcs_string(o.status) || ',"reported_outcome":' || ledger.jcs_string(outcome)
        || COALESCE(',"reported_reason":' || reason, '') || COALESCE(',"reported_receipt":' || receipt, '')
        || ',"source":' || ledger.jcs_string(source) || '}');
END
$$;

-- Move to the reported outcome, recording who and what (an expired lease is materialised first).
CREATE PROCEDURE ledger.settle(
    INOUT o ledger.operations, INOUT events jsonb, clock timestamptz, actor text, kind text,
    outcome text, receipt text, reason text, evidence text, incident text)
LANGUAGE plpgsql AS $$
DECLARE
    now timestamptz := date_trunc('milliseconds', clock);
    terminal boolean := outcome IN ('committed', 'not_applied');
    from_status text;
BEGIN
    CALL ledger.expire_if_due(o, events, clock);
    from_status := o.status;
    o.status := outcome;
    o.receipt := CASE WHEN outcome = 'committed' AND receipt IS NOT NULL
        THEN receipt::jsonb || jsonb_build_object('recorded_by', actor, 'recorded_at', ledger.ts_text(now)) END;
    o.not_applied_reason := CASE WHEN outcome = 'not_applied' THEN reason::jsonb END;
    o.lease_expires_at := NULL;
    o.updated_at := now;
    o.resolved_at := CASE WHEN terminal THEN now END;
    o.resolved_by := CASE WHEN terminal THEN actor END;
    CALL ledger.chain_event(o, events, now, kind, actor, from_status, outcome,
        '{' || COALESCE('"evidence":' || evidence || ',', '') || COALESCE('"incident":' || to_json(incident)::text || ',', '')
        || '"outcome":' || ledger.jcs_string(outcome) || COALESCE(',"reason":' || reason, '')
        || COALESCE(',"receipt":' || receipt, '') || '}');
END
$$;

-- Complete: the executor's report of committed, not_applied or unknown (a late report from unknown
-- too). With `incident` (complete(unknown) with diagnostics) the incident row is inserted in the same
-- transaction when the report is recorded; a repeat answers with the reference stored the first time.
-- outcome: completed | unchanged | not_found | validation_failed | a refusal code.
CREATE FUNCTION ledger.complete(
    tenant text, operation_id text, actor text, token_hash bytea, outcome text, receipt text,
    reason text, incident jsonb,
    OUT outcome_code text, OUT op ledger.operations, OUT db_now timestamptz, OUT events jsonb,
    OUT incident_ref text)
LANGUAGE plpgsql AS $$
DECLARE
    status text;
    incident_id text := incident ->> 'incident_id';
BEGIN
    events := '[]';
    op := ledger.lock_operation(tenant, operation_id);
    db_now := clock_timestamp();
    IF op.tenant_id IS NULL THEN
        outcome_code := 'not_found';
        RETURN;
    END IF;
    IF op.claim_token_hash IS DISTINCT FROM token_hash THEN
        outcome_code := 'stale_claim';
        RETURN;
    END IF;
    status := ledger.effective_status(op, db_now);
    IF status IN ('committed', 'not_applied') THEN
        IF ledger.same_outcome(op, outcome, receipt::jsonb, reason::jsonb) THEN
            outcome_code := 'unchanged';
            RETURN;
        END IF;
        CALL ledger.record_discrepancy(op, events, db_now, actor, 'complete', outcome, receipt, reason);
        PERFORM ledger.write_change(op, events);
        outcome_code := 'conflicting_outcome';
        RETURN;
    END IF;
    IF outcome = 'unknown' AND status = 'pending' THEN
        outcome_code := 'invalid_transition';
        RETURN;
    END IF;
    IF (incident ->> 'attempt')::integer IS DISTINCT FROM op.attempt AND incident ->> 'attempt' IS NOT NULL THEN
        outcome_code := 'validation_failed';  -- the diagnostics name another attempt: nothing is written
        RETURN;
    END IF;
    outcome_code := 'completed';
    IF outcome = 'unknown' AND status = 'unknown' THEN
        CALL ledger.expire_if_due(op, events, db_now);  -- already unknown: at most the expiry is recorded
        outcome_code := CASE WHEN jsonb_array_length(events) > 0 THEN 'completed' ELSE 'unchanged' END;
        incident_ref := CASE WHEN incident IS NOT NULL THEN (
            SELECT e.data ->> 'incident' FROM ledger.events AS e
            WHERE e.tenant_id = complete.tenant AND e.operation_id = complete.operation_id
              AND e.attempt = op.attempt AND e.kind = 'completed' AND e.to_status = 'unknown'
            ORDER BY e.seq DESC LIMIT 1) END;
    ELSE
        CALL ledger.settle(op, events, db_now, actor, 'completed', outcome, receipt, reason, NULL, incident_id);
        incident_ref := incident_id;
    END IF;
    IF events = '[]' THEN
        RETURN;
    END IF;
    PERFORM ledger.write_change(op, events);
    IF incident_id IS NOT NULL AND incident_ref = incident_id THEN
        INSERT INTO diagnostics.incidents (
            tenant_id, incident_id, source, principal, operation_id, attempt, phase, cause, http_status,
            provider, provider_request_id, retryable_hint, elapsed_ms, detail_code, headers, route, method,
            exception_type, created_at)
        SELECT tenant, i.incident_id, i.source, i.principal, i.operation_id, op.attempt, i.phase, i.cause,
               i.http_status, i.provider, i.provider_request_id, i.retryable_hint, i.elapsed_ms,
               i.detail_code, i.headers, i.route, i.method, i.exception_type,
               COALESCE(i.created_at, clock_timestamp())
        FROM jsonb_to_record(incident) AS i(
            incident_id text, source text, principal text, operation_id text, phase text, cause text,
            http_status integer, provider text, provider_request_id text, retryable_hint boolean,
            elapsed_ms bigint, detail_code text, headers jsonb, route text, method text,
            exception_type text, created_at timestamptz);
    END IF;
END
$$;

-- Resolve: a reconciler's verdict on an unknown operation from evidence; `unresolved` records the try.
-- outcome: resolved | unchanged | not_found | a refusal code.
CREATE FUNCTION ledger.resolve(
    tenant text, operation_id text, actor text, outcome text, receipt text, reason text, evidence text,
    OUT outcome_code text, OUT op ledger.operations, OUT db_now timestamptz, OUT events jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    status text;
BEGIN
    events := '[]';
    op := ledger.lock_operation(tenant, operation_id);
    db_now := clock_timestamp();
    IF op.tenant_id IS NULL THEN
        outcome_code := 'not_found';
        RETURN;
    END IF;
    status := ledger.effective_status(op, db_now);
    IF status IN ('committed', 'not_applied') THEN
        IF ledger.same_outcome(op, outcome, receipt::jsonb, reason::jsonb) THEN
            outcome_code := 'unchanged';
            RETURN;
        END IF;
        CALL ledger.record_discrepancy(op, events, db_now, actor, 'resolve', outcome, receipt, reason);
        PERFORM ledger.write_change(op, events);
        outcome_code := 'conflicting_outcome';
        RETURN;
    END IF;
    IF status <> 'unknown' THEN
        outcome_code := 'invalid_transition';
        RETURN;
    END IF;
    IF outcome = 'unresolved' THEN
        CALL ledger.expire_if_due(op, events, db_now);
        op.updated_at := date_trunc('milliseconds', db_now);
        CALL ledger.chain_event(op, events, op.updated_at, 'reconcile_unresolved', actor, 'unknown', 'unknown',
            '{"evidence":' || COALESCE(evidence, 'null') || '}');
    ELSE
        CALL ledger.settle(op, events, db_now, actor, 'resolved', outcome, receipt, reason, evidence, NULL);
    END IF;
    PERFORM ledger.write_change(op, events);
    outcome_code := 'resolved';
END
$$;

-- The sweeper's step for one expired submitted operation (run by the owner, under the row's tenant).
-- outcome: expired | unchanged | not_found.
CREATE FUNCTION ledger.sweep(
    tenant text, operation_id text,
    OUT outcome text, OUT op ledger.operations, OUT db_now timestamptz, OUT events jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    events := '[]';
    op := ledger.lock_operation(tenant, operation_id);
    db_now := clock_timestamp();
    IF op.tenant_id IS NULL THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    CALL ledger.expire_if_due(op, events, db_now);
    IF events = '[]' THEN
        outcome := 'unchanged';
        RETURN;
    END IF;
    PERFORM ledger.write_change(op, events);
    outcome := 'expired';
END
$$;

-- No grants: functions are executable by PUBLIC, and only the runtime role may use schema ledger
-- (0001). The functions run with the caller's rights (SECURITY INVOKER): row-level security and the
-- table grants still decide what each statement may touch.
"""


def upgrade() -> None:
    """Create the write-path functions and let the runtime role execute them."""
    execute_script(WRITE_PATH)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
