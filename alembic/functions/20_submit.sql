-- ledger.submit: pending -> submitted with the lease renewed; a repeat while submitted changes
-- nothing. One statement, one round trip (db/ledger.submit).
--
-- outcome (domain/outcomes.Outcome): submitted | unchanged | not_found
--   | stale_claim | outcome_unknown | invalid_transition
-- In order: no row (or another tenant's) -> not_found; another attempt's token -> stale_claim;
-- submitted with a live lease -> unchanged for the same (or no) effect_ref, else invalid_transition;
-- submitted with an expired lease, or unknown -> outcome_unknown; terminal -> invalid_transition.
-- A pending operation is submitted even if its lease ran out (nobody else has claimed it).
CREATE OR REPLACE FUNCTION ledger.submit(
    tenant text, operation_id text, token_hash bytea, effect_ref text, lease_seconds integer,
    OUT outcome text, OUT op ledger.operations, OUT db_now timestamptz, OUT events jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    bound text;  -- ledger.bind_tenant's answer (unused)
    now timestamptz;
    lease_end timestamptz;
    body text;     -- the event's data in JCS text (hashed as written)
    digest text;   -- the event's hash: the new chain head
    doc jsonb;     -- the event's data as stored
BEGIN
    events := '[]';
    bound := ledger.bind_tenant(tenant);
    SELECT * INTO op FROM ledger.operations AS t
    WHERE t.tenant_id = submit.tenant AND t.operation_id = submit.operation_id
    FOR UPDATE;
    db_now := clock_timestamp();  -- after the lock: the clock the decision is taken at
    outcome := CASE
        WHEN op.tenant_id IS NULL THEN 'not_found'
        WHEN op.claim_token_hash IS DISTINCT FROM token_hash THEN 'stale_claim'
        WHEN op.status = 'submitted' AND COALESCE(op.lease_expires_at > db_now, false) THEN
            CASE WHEN effect_ref IS NULL OR effect_ref = op.effect_ref THEN 'unchanged' ELSE 'invalid_transition' END
        WHEN op.status IN ('submitted', 'unknown') THEN 'outcome_unknown'
        WHEN op.status <> 'pending' THEN 'invalid_transition'
        ELSE 'submitted'
    END;
    IF outcome <> 'submitted' THEN
        RETURN;
    END IF;
    now := date_trunc('milliseconds', db_now);
    lease_end := now + make_interval(secs => COALESCE(lease_seconds, op.lease_seconds));
    -- The event, inline rather than through ledger.append_event (one function call and its
    -- expressions fewer on the hottest transition); the same hash and row.
    body := ledger.submitted_data(effect_ref, lease_end);
    digest := ledger.event_hash(op.chain_hash, operation_id, op.chain_seq + 1, now, 'submitted', op.principal,
                                'pending', 'submitted', op.attempt, body);
    doc := body::jsonb;
    INSERT INTO ledger.events (
        tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
    VALUES (tenant, operation_id, op.chain_seq + 1, now, 'submitted', op.principal, 'pending', 'submitted',
            op.attempt, doc, op.chain_hash, digest);
    events := jsonb_build_array(ledger.event_json('submitted', op.principal, 'pending', 'submitted',
                                                  op.attempt, doc));
    UPDATE ledger.operations AS t SET
        status = 'submitted', effect_ref = submit.effect_ref,
        lease_seconds = COALESCE(submit.lease_seconds, t.lease_seconds), lease_expires_at = lease_end,
        submitted_at = now, updated_at = now, chain_seq = t.chain_seq + 1, chain_hash = digest
    WHERE t.tenant_id = submit.tenant AND t.operation_id = submit.operation_id
    RETURNING * INTO op;
END
$$;
