-- ledger.resolve: a reconciler's verdict on an unknown operation from evidence; `unresolved` records
-- the look-up. One statement, one round trip (db/ledger.resolve).
--
-- outcome_code (domain/outcomes.Outcome): resolved | unchanged | not_found | conflicting_outcome
--   | invalid_transition
-- In order: no row -> not_found; terminal -> unchanged when the report repeats it or is `unresolved`
-- (ledger.same_outcome), else conflicting_outcome with a `discrepancy` event; anything but unknown
-- (a submitted lease that ran out is unknown) -> invalid_transition; otherwise resolved: the
-- `reconcile_unresolved` event, or the outcome recorded (after the `lease_expired` event, if due).
CREATE OR REPLACE FUNCTION ledger.resolve(
    tenant text, operation_id text, actor text, outcome text, receipt text, reason text, evidence text,
    OUT outcome_code text, OUT op ledger.operations, OUT db_now timestamptz, OUT events jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    bound text;  -- ledger.bind_tenant's answer (unused)
    status text;
    now timestamptz;
    terminal constant boolean := outcome IN ('committed', 'not_applied');
    seq integer;
    head text;
    e jsonb;
    recorded_receipt jsonb;
    recorded_reason jsonb;
    repeated boolean;  -- a terminal row: whether the report repeats what it records
BEGIN
    events := '[]';
    bound := ledger.bind_tenant(tenant);
    SELECT * INTO op FROM ledger.operations AS t
    WHERE t.tenant_id = resolve.tenant AND t.operation_id = resolve.operation_id
    FOR UPDATE;
    db_now := clock_timestamp();
    now := date_trunc('milliseconds', db_now);
    status := CASE WHEN op.status = 'submitted' AND NOT COALESCE(op.lease_expires_at > db_now, false)
                   THEN 'unknown' ELSE op.status END;
    IF status IN ('committed', 'not_applied') THEN  -- (ledger.complete says why it is not in the CASE)
        repeated := ledger.same_outcome(op, outcome, receipt::jsonb, reason::jsonb);
    END IF;
    outcome_code := CASE
        WHEN op.tenant_id IS NULL THEN 'not_found'
        WHEN status IN ('committed', 'not_applied') THEN
            CASE WHEN repeated THEN 'unchanged' ELSE 'conflicting_outcome' END
        WHEN status <> 'unknown' THEN 'invalid_transition'
        ELSE 'resolved'
    END;
    IF outcome_code = 'conflicting_outcome' THEN  -- the disagreement is recorded, the state kept
        e := ledger.append_event(tenant, operation_id, op.chain_seq + 1, op.chain_hash, now, 'discrepancy', actor,
                                 status, status, op.attempt,
                                 ledger.discrepancy_data(op.status, outcome, receipt, reason, 'resolve'));
        events := jsonb_build_array(e);
        UPDATE ledger.operations AS t SET chain_seq = t.chain_seq + 1, chain_hash = e ->> 'hash'
        WHERE t.tenant_id = resolve.tenant AND t.operation_id = resolve.operation_id
        RETURNING * INTO op;
        RETURN;
    END IF;
    IF outcome_code <> 'resolved' THEN
        RETURN;
    END IF;
    seq := op.chain_seq;
    head := op.chain_hash;
    IF op.status = 'submitted' THEN  -- unknown by an expired lease: materialise it first
        seq := seq + 1;
        e := ledger.append_event(tenant, operation_id, seq, head, now, 'lease_expired', 'effect-ledger',
                                 'submitted', 'unknown', op.attempt, ledger.lease_data(op.lease_expires_at));
        events := jsonb_build_array(e);
        head := e ->> 'hash';
    END IF;
    seq := seq + 1;
    IF outcome = 'unresolved' THEN
        e := ledger.append_event(tenant, operation_id, seq, head, now, 'reconcile_unresolved', actor,
                                 'unknown', 'unknown', op.attempt, '{"evidence":' || COALESCE(evidence, 'null') || '}');
        events := events || e;
        UPDATE ledger.operations AS t SET
            status = 'unknown', updated_at = now, chain_seq = seq, chain_hash = e ->> 'hash'
        WHERE t.tenant_id = resolve.tenant AND t.operation_id = resolve.operation_id
        RETURNING * INTO op;
        RETURN;
    END IF;
    -- Record the outcome (the same settlement as ledger.complete's): committed keeps its receipt,
    -- not_applied its reason, or the call is refused (check_violation, nothing written; migration 0016).
    IF (outcome = 'committed' AND receipt IS NULL) OR (outcome = 'not_applied' AND reason IS NULL) THEN
        RAISE EXCEPTION 'a % outcome needs its %', outcome,
            CASE outcome WHEN 'committed' THEN 'receipt' ELSE 'reason' END USING ERRCODE = 'check_violation';
    END IF;
    e := ledger.append_event(tenant, operation_id, seq, head, now, 'resolved', actor, 'unknown', outcome, op.attempt,
                             ledger.settled_data(outcome, receipt, reason, evidence, NULL));
    events := events || e;
    -- computed here, not in the UPDATE: Citus refuses non-IMMUTABLE functions inside CASE in a
    -- routed UPDATE
    recorded_receipt := CASE WHEN outcome = 'committed' AND receipt IS NOT NULL THEN
        receipt::jsonb || jsonb_build_object('recorded_by', actor, 'recorded_at', ledger.ts_text(now)) END;
    recorded_reason := CASE WHEN outcome = 'not_applied' THEN reason::jsonb END;
    UPDATE ledger.operations AS t SET
        status = resolve.outcome,
        receipt = recorded_receipt, not_applied_reason = recorded_reason,
        lease_expires_at = NULL, updated_at = now,
        resolved_at = CASE WHEN terminal THEN now END, resolved_by = CASE WHEN terminal THEN actor END,
        chain_seq = seq, chain_hash = e ->> 'hash',
        commit_hash = CASE WHEN resolve.outcome = 'committed' THEN e ->> 'hash' END  -- as ledger.complete's
    WHERE t.tenant_id = resolve.tenant AND t.operation_id = resolve.operation_id
    RETURNING * INTO op;
    -- A commit waits for its feed position in ledger.feed_pending (migration 0019): a narrow row the
    -- sequencer moves to ledger.feed, so the operation's row is not written again for it.
    IF outcome = 'committed' THEN
        INSERT INTO ledger.feed_pending (tenant_id, resolved_at, operation_id) VALUES (tenant, now, operation_id);
    END IF;
END
$$;
