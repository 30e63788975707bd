-- ledger.complete: the executor's report of committed, not_applied or unknown (a late report from
-- unknown too). With `incident` (complete(unknown) with diagnostics) the incident row is inserted in
-- the same transaction when the report is recorded; a repeat answers with the reference stored the
-- first time. One statement, one round trip (db/ledger.complete).
--
-- outcome_code (domain/outcomes.Outcome): completed | unchanged | not_found | validation_failed
--   | stale_claim | conflicting_outcome | invalid_transition
-- In order: no row -> not_found; another attempt's token -> stale_claim; terminal -> unchanged when
-- the report repeats it (ledger.same_outcome), else conflicting_outcome with a `discrepancy` event;
-- unknown reported while pending -> invalid_transition; diagnostics naming another attempt ->
-- validation_failed (nothing written); unknown reported while unknown -> at most the expiry is
-- recorded (completed, or unchanged), unless it carries the attempt's first diagnostics (recorded:
-- completed, 0024); otherwise the outcome is recorded (completed). Committed
-- without a receipt, or not_applied without a reason, is refused with check_violation (SQLSTATE
-- 23514, nothing written), as the table check did before migration 0016.
-- A submitted operation whose lease ran out first gets its `lease_expired` event (unknown), then the report.
CREATE OR REPLACE FUNCTION ledger.complete(
    tenant text, operation_id text, actor text, token_hash bytea, outcome text, receipt text,
    reason text, incident jsonb,
    OUT outcome_code text, OUT op ledger.operations, OUT db_now timestamptz, OUT events jsonb,
    OUT incident_ref text)
LANGUAGE plpgsql AS $$
DECLARE
    bound text;  -- ledger.bind_tenant's answer (unused)
    status text;
    now timestamptz;
    terminal constant boolean := outcome IN ('committed', 'not_applied');
    incident_id constant text := incident ->> 'incident_id';
    seq integer;
    head text;
    e jsonb;
    body text;    -- the `completed` event's data in JCS text (hashed as written)
    digest text;  -- its hash: the new chain head
    doc jsonb;    -- its data as stored
    recorded_receipt jsonb;
    recorded_reason jsonb;
    cur record;   -- the locked row's columns that the decision and the events read
    repeated boolean;  -- a terminal row: whether the report repeats what it records
    lease timestamptz;  -- the lease the row keeps: none once settled, the one it had if already unknown
BEGIN
    events := '[]';
    bound := ledger.bind_tenant(tenant);
    -- Lock the row and read only what the decision and the events need (a narrower target list is a
    -- cheaper executor start: ledger.submit says why); the whole row is read, locked already, where a
    -- path needs it: a terminal row's comparison with the report, and a refusal's answer.
    SELECT t.tenant_id, t.claim_token_hash, t.status, t.lease_expires_at, t.chain_seq, t.chain_hash, t.attempt
    INTO cur FROM ledger.operations AS t
    WHERE t.tenant_id = complete.tenant AND t.operation_id = complete.operation_id
    FOR UPDATE;
    db_now := clock_timestamp();
    now := date_trunc('milliseconds', db_now);
    status := CASE WHEN cur.status = 'submitted' AND NOT COALESCE(cur.lease_expires_at > db_now, false)
                   THEN 'unknown' ELSE cur.status END;
    IF status IN ('committed', 'not_applied') THEN  -- a repeat or a conflict: the report against the row
        SELECT * INTO op FROM ledger.operations AS t
        WHERE t.tenant_id = complete.tenant AND t.operation_id = complete.operation_id;
        -- compared here, not inside the CASE below: PL/pgSQL sets up a whole expression in every
        -- transaction that evaluates it, unreached branches too, so the hot path pays nothing for it
        repeated := ledger.same_outcome(op, outcome, receipt::jsonb, reason::jsonb);
    END IF;
    outcome_code := CASE
        WHEN cur.tenant_id IS NULL THEN 'not_found'
        WHEN cur.claim_token_hash IS DISTINCT FROM token_hash THEN 'stale_claim'
        WHEN status IN ('committed', 'not_applied') THEN
            CASE WHEN repeated THEN 'unchanged' ELSE 'conflicting_outcome' END
        WHEN outcome = 'unknown' AND status = 'pending' THEN 'invalid_transition'
        WHEN incident ->> 'attempt' IS NOT NULL AND (incident ->> 'attempt')::integer <> cur.attempt
            THEN 'validation_failed'  -- the diagnostics name another attempt: nothing is written
        ELSE 'completed'
    END;
    IF outcome_code = 'conflicting_outcome' THEN  -- the disagreement is recorded, the state kept
        e := ledger.append_event(tenant, operation_id, op.chain_seq + 1, op.chain_hash, now, 'discrepancy', actor,
                                 status, status, op.attempt,
                                 ledger.discrepancy_data(op.status, outcome, receipt, reason, 'complete'));
        events := jsonb_build_array(e);
        UPDATE ledger.operations AS t SET chain_seq = t.chain_seq + 1, chain_hash = e ->> 'hash'
        WHERE t.tenant_id = complete.tenant AND t.operation_id = complete.operation_id
        RETURNING * INTO op;
        RETURN;
    END IF;
    IF outcome_code <> 'completed' THEN
        IF op.tenant_id IS NULL THEN  -- the refusal's answer shows the row (none: not_found)
            SELECT * INTO op FROM ledger.operations AS t
            WHERE t.tenant_id = complete.tenant AND t.operation_id = complete.operation_id;
        END IF;
        RETURN;
    END IF;
    seq := cur.chain_seq;
    head := cur.chain_hash;
    IF cur.status = 'submitted' AND status = 'unknown' THEN  -- the lease ran out: materialise it first
        seq := seq + 1;
        e := ledger.append_event(tenant, operation_id, seq, head, now, 'lease_expired', 'effect-ledger',
                                 'submitted', 'unknown', cur.attempt, ledger.lease_data(cur.lease_expires_at));
        events := jsonb_build_array(e);
        head := e ->> 'hash';
    END IF;
    IF outcome = 'unknown' AND status = 'unknown' THEN
        -- already unknown (reported, swept, or its lease ran out): a repeat with diagnostics names the
        -- incident stored first
        incident_ref := CASE WHEN incident IS NOT NULL THEN (
            SELECT ev.data ->> 'incident' FROM ledger.events AS ev
            WHERE ev.tenant_id = complete.tenant AND ev.operation_id = complete.operation_id
              AND ev.attempt = cur.attempt AND ev.kind = 'completed' AND ev.to_status = 'unknown'
            ORDER BY ev.seq DESC LIMIT 1) END;
        IF incident IS NULL OR incident_ref IS NOT NULL THEN
            IF cur.status = 'unknown' THEN  -- nothing to record
                outcome_code := 'unchanged';
                SELECT * INTO op FROM ledger.operations AS t
                WHERE t.tenant_id = complete.tenant AND t.operation_id = complete.operation_id;
            ELSE  -- reported unknown after the lease ran out: the expiry is all there is to record
                UPDATE ledger.operations AS t SET
                    status = 'unknown', updated_at = now, chain_seq = seq, chain_hash = head
                WHERE t.tenant_id = complete.tenant AND t.operation_id = complete.operation_id
                RETURNING * INTO op;
            END IF;
            RETURN;
        END IF;
        -- The attempt's first diagnostics: recorded below as any report of unknown is, a `completed`
        -- event (unknown -> unknown) with its incident (migration 0024; until then they were dropped
        -- when the lease had run out or the sweep had come first, and the answer carried no incident).
    END IF;
    -- Record the reported outcome (the same settlement as ledger.resolve's). A committed outcome
    -- keeps its receipt, a not_applied one its reason (API.md section 6): the rule lives here, not in
    -- a table check (migration 0016); the service never sends either without (domain.Report).
    IF (outcome = 'committed' AND receipt IS NULL) OR (outcome = 'not_applied' AND reason IS NULL) THEN
        RAISE EXCEPTION 'a % outcome needs its %', outcome,
            CASE outcome WHEN 'committed' THEN 'receipt' ELSE 'reason' END USING ERRCODE = 'check_violation';
    END IF;
    -- Its event inline, as in ledger.submit (no nested function call on the hot path).
    seq := seq + 1;
    body := ledger.settled_data(outcome, receipt, reason, NULL, incident_id);
    digest := ledger.event_hash(head, operation_id, seq, now, 'completed', actor, status, outcome, cur.attempt, body);
    doc := body::jsonb;
    INSERT INTO ledger.events (
        tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
    VALUES (tenant, operation_id, seq, now, 'completed', actor, status, outcome, cur.attempt, doc, head, digest);
    events := events || ledger.event_json('completed', status, outcome, cur.attempt);
    -- computed here, not in the UPDATE: Citus refuses non-IMMUTABLE functions inside CASE in a
    -- routed UPDATE. The receipt and the reason as the event's data parsed them (not parsed again).
    recorded_receipt := CASE WHEN outcome = 'committed' AND receipt IS NOT NULL THEN
        (doc -> 'receipt') || jsonb_build_object('recorded_by', actor, 'recorded_at', ledger.ts_text(now)) END;
    recorded_reason := CASE WHEN outcome = 'not_applied' THEN doc -> 'reason' END;
    -- unknown reported (with the attempt's first diagnostics) on a row already unknown, its lease run
    -- out or swept: the lease stays as it was, as without diagnostics, so `lease_expired` reads true
    -- before and after the report (migration 0026; until then it turned false, the lease cleared)
    lease := CASE WHEN outcome = 'unknown' AND status = 'unknown' THEN cur.lease_expires_at END;
    UPDATE ledger.operations AS t SET
        status = complete.outcome,
        receipt = recorded_receipt, not_applied_reason = recorded_reason,
        lease_expires_at = lease, updated_at = now,
        resolved_at = CASE WHEN terminal THEN now END, resolved_by = CASE WHEN terminal THEN actor END,
        chain_seq = seq, chain_hash = digest,
        -- the receipt's leaf records this event's hash (API.md section 14), whatever a later
        -- discrepancy appends to the chain (migration 0023)
        commit_hash = CASE WHEN complete.outcome = 'committed' THEN digest END
    WHERE t.tenant_id = complete.tenant AND t.operation_id = complete.operation_id
    RETURNING * INTO op;
    -- A commit waits for its feed position in ledger.feed_pending (migration 0019): a narrow row the
    -- sequencer moves to ledger.feed, so the operation's row is not written again for it.
    IF outcome = 'committed' THEN
        INSERT INTO ledger.feed_pending (tenant_id, resolved_at, operation_id) VALUES (tenant, now, operation_id);
    END IF;
    incident_ref := incident_id;
    IF incident_id IS NOT NULL THEN
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
