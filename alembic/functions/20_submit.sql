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
    cur record;    -- the locked row's columns that the decision and the event read
BEGIN
    events := '[]';
    bound := ledger.bind_tenant(tenant);
    -- Lock the row and read only what the decision and the event need: a narrower target list is a
    -- cheaper executor start (row-level security's tenant test makes it a gating Result node that
    -- projects every column read: 29 for `SELECT *`, ~50 k instructions more per call). A refusal
    -- reads the whole row for its answer (locked already, by this transaction).
    SELECT t.tenant_id, t.claim_token_hash, t.status, t.lease_expires_at, t.effect_ref, t.lease_seconds,
           t.chain_hash, t.chain_seq, t.principal, t.attempt
    INTO cur FROM ledger.operations AS t
    WHERE t.tenant_id = submit.tenant AND t.operation_id = submit.operation_id
    FOR UPDATE;
    db_now := clock_timestamp();  -- after the lock: the clock the decision is taken at
    outcome := CASE
        WHEN cur.tenant_id IS NULL THEN 'not_found'
        WHEN cur.claim_token_hash IS DISTINCT FROM token_hash THEN 'stale_claim'
        WHEN cur.status = 'submitted' AND COALESCE(cur.lease_expires_at > db_now, false) THEN
            CASE WHEN effect_ref IS NULL OR effect_ref = cur.effect_ref THEN 'unchanged' ELSE 'invalid_transition' END
        WHEN cur.status IN ('submitted', 'unknown') THEN 'outcome_unknown'
        WHEN cur.status <> 'pending' THEN 'invalid_transition'
        ELSE 'submitted'
    END;
    IF outcome <> 'submitted' THEN
        SELECT * INTO op FROM ledger.operations AS t
        WHERE t.tenant_id = submit.tenant AND t.operation_id = submit.operation_id;
        RETURN;
    END IF;
    now := date_trunc('milliseconds', db_now);
    lease_end := now + make_interval(secs => COALESCE(lease_seconds, cur.lease_seconds));
    -- The event, inline rather than through ledger.append_event (one function call and its
    -- expressions fewer on the hottest transition); the same hash and row.
    body := ledger.submitted_data(effect_ref, lease_end);
    digest := ledger.event_hash(cur.chain_hash, operation_id, cur.chain_seq + 1, now, 'submitted', cur.principal,
                                'pending', 'submitted', cur.attempt, body);
    doc := body::jsonb;
    INSERT INTO ledger.events (
        tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data, prev_hash, hash)
    VALUES (tenant, operation_id, cur.chain_seq + 1, now, 'submitted', cur.principal, 'pending', 'submitted',
            cur.attempt, doc, cur.chain_hash, digest);
    events := jsonb_build_array(ledger.event_json('submitted', 'pending', 'submitted', cur.attempt));
    UPDATE ledger.operations AS t SET
        status = 'submitted', effect_ref = submit.effect_ref,
        lease_seconds = COALESCE(submit.lease_seconds, t.lease_seconds), lease_expires_at = lease_end,
        submitted_at = now, updated_at = now, chain_seq = t.chain_seq + 1, chain_hash = digest
    WHERE t.tenant_id = submit.tenant AND t.operation_id = submit.operation_id
    RETURNING * INTO op;
END
$$;
