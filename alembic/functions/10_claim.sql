-- ledger.claim: claim an operation ID (docs/api.md section 6), optionally submitting it in the same
-- transaction. One statement in autocommit, one round trip (db/ledger.claim).
--
-- Who wins: INSERT ... ON CONFLICT DO NOTHING (it waits for a concurrent inserter of the same key).
-- A loser reads the row without a lock and decides; only a new attempt locks the row (FOR UPDATE)
-- and decides again, since someone may have moved it since the unlocked read. A row purged between
-- our conflicting insert and our read makes us insert again (at most three rounds: `vanished`).
--
-- outcome (domain/outcomes.Outcome): created | new_attempt | replay | reuse_receipt
--   | intent_conflict | operation_in_progress | outcome_unknown | vanished
--   | approval_required | approval_denied (API.md section 15: nothing created or changed)
-- The verdict on an existing row, in order (the first that applies):
--   binding differs (principal, tool, version, intent)   -> intent_conflict (before anything else,
--                                                           so a foreign intent learns nothing)
--   committed                                            -> reuse_receipt
--   pending or submitted with a live lease               -> replay (same nonce) | operation_in_progress
--   submitted with an expired lease, or unknown          -> outcome_unknown (the effect may have happened)
--   pending with an expired lease, or not_applied        -> new_attempt (attempt + 1, the old token stale)
--
-- Approvals (migration 0011, docs/approvals.md). With `approval_policy` (NULL when no rule covers the
-- tool: an ungated claim pays one IS NULL test), an attempt is granted only through a valid approval
-- of this exact binding: ledger.approval_gate locks the binding's live request, expires it by the
-- database clock, requests one where there is none, and answers `approved` with the request consumed
-- in memory; the claim writes the consumption (ledger.approval_write) only once its attempt is
-- granted, in this transaction, and records the approval and its approvers first in the `claimed`
-- (`reclaimed`) event's data. A new ID is gated before the insert, an existing one after its verdict,
-- under the row lock. `approval` is the request's row (as jsonb: this file is applied by 0009, before
-- the approvals table exists) whenever the gate spoke; on a refusal with `expired_here`, how many
-- requests the gate expired on the way (their `expired` events commit with this call: migration 0015).
CREATE OR REPLACE FUNCTION ledger.claim(
    tenant text, operation_id text, principal text, tool text, tool_version text, intent_digest text,
    lease_seconds integer, nonce_hash bytea, token_hash bytea, sealed_token bytea, submit boolean,
    effect_ref text, approval_policy jsonb,
    OUT outcome text, OUT op ledger.operations, OUT db_now timestamptz, OUT events jsonb, OUT approval jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    bound text;  -- ledger.bind_tenant's answer (unused)
    now timestamptz;
    lease_end timestamptz;
    genesis constant text := repeat('0', 64);
    claimed_data text;
    submitted_data text;
    claimed_hash text;
    submitted_hash text;
    e jsonb;
    doc jsonb;            -- the `claimed` event's data as stored
    submitted_doc jsonb;  -- the `submitted` event's
    gate record;  -- the approval gate's answer for the attempt about to be granted (NULL: ungated)
    gate_outcome text;
    expired_here integer := 0;  -- requests the gate found past their validity and expired (metrics)
    approval_data text;  -- '"approval":{...},' first in the event's JCS data, or ''
BEGIN
    bound := ledger.bind_tenant(tenant);
    FOR round IN 1..3 LOOP
        db_now := clock_timestamp();
        now := date_trunc('milliseconds', db_now);
        lease_end := now + make_interval(secs => lease_seconds);
        -- A new ID under a policy needs its yes before the insert (no operation is created without
        -- one). An existing ID skips this: its verdict comes first, below.
        gate_outcome := NULL;
        approval_data := '';
        -- Two tests, not one `AND NOT EXISTS`: a condition with a subquery is a whole query through
        -- SPI, one without is a simple expression, so an ungated claim pays only the IS NULL test.
        IF approval_policy IS NULL THEN
            NULL;
        ELSIF NOT EXISTS (SELECT 1 FROM ledger.operations AS o
                          WHERE o.tenant_id = claim.tenant AND o.operation_id = claim.operation_id) THEN
            SELECT g.* INTO gate FROM ledger.approval_gate(
                tenant, operation_id, principal, tool, tool_version, intent_digest,
                approval_policy, true, 1, db_now) AS g;
            gate_outcome := gate.outcome;
            expired_here := expired_here + gate.expired;
            CONTINUE WHEN gate_outcome = 'retry';
            IF gate_outcome <> 'approved' THEN  -- the gate answers approved | approval_denied | approval_required
                outcome := CASE gate_outcome WHEN 'approval_denied' THEN 'approval_denied' ELSE 'approval_required' END;
                approval := to_jsonb(gate.approval) || jsonb_build_object('expired_here', expired_here);
                op := NULL;
                events := '[]';
                RETURN;
            END IF;
            approval_data := gate.chain_data || ',';
        END IF;
        -- The new row's chain, hashed before the insert (its head is stored on the row): `claimed` is
        -- seq 1 after the genesis hash, `submitted` seq 2 when asked to submit.
        -- (ledger.lease_data's text, written out: a timestamp's RFC 3339 text needs no JSON escaping)
        claimed_data := '{' || approval_data || '"lease_expires_at":"' || ledger.ts_text(lease_end) || '"}';
        claimed_hash := ledger.event_hash(genesis, operation_id, 1, now, 'claimed', principal, NULL, 'pending', 1,
                                          claimed_data);
        IF submit THEN
            submitted_data := ledger.submitted_data(effect_ref, lease_end);
            submitted_hash := ledger.event_hash(claimed_hash, operation_id, 2, now, 'submitted', principal,
                                                'pending', 'submitted', 1, submitted_data);
        END IF;
        INSERT INTO ledger.operations AS t (
            tenant_id, operation_id, principal, tool, tool_version, intent_digest, status, attempt,
            claim_token_hash, client_nonce_hash, sealed_token, lease_seconds, lease_expires_at, effect_ref,
            created_at, updated_at, submitted_at, chain_seq, chain_hash)
        VALUES (
            tenant, operation_id, principal, tool, tool_version, intent_digest,
            CASE WHEN submit THEN 'submitted' ELSE 'pending' END, 1,
            token_hash, nonce_hash, sealed_token, lease_seconds, lease_end,
            CASE WHEN submit THEN effect_ref END, now, now, CASE WHEN submit THEN now END,
            CASE WHEN submit THEN 2 ELSE 1 END, COALESCE(submitted_hash, claimed_hash))
        ON CONFLICT ON CONSTRAINT operations_pkey DO NOTHING
        RETURNING * INTO op;
        -- Who won: the row holds our (random) token hash only if our insert made it. Not FOUND: on a
        -- Citus worker (the call delegated there) the skipped row is still counted. An insert that
        -- conflicted returns no row (op is NULL): read the row that won, without a lock (one
        -- statement fewer for a new ID than reading it back every time: issue 20, round 4).
        IF op.tenant_id IS NULL THEN
            SELECT * INTO op FROM ledger.operations AS o
            WHERE o.tenant_id = claim.tenant AND o.operation_id = claim.operation_id;
            CONTINUE WHEN op.tenant_id IS NULL;  -- purged since our insert conflicted: insert again
        END IF;
        IF op.claim_token_hash = token_hash AND op.attempt = 1 AND op.created_at = now THEN
            -- Ours: its events, hashed above, inserted here (not through ledger.append_event, which
            -- would hash them again); one INSERT for both when it submits too.
            doc := claimed_data::jsonb;
            events := jsonb_build_array(ledger.event_json('claimed', NULL, 'pending', 1));
            IF submit THEN
                submitted_doc := submitted_data::jsonb;
                INSERT INTO ledger.events (
                    tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data,
                    prev_hash, hash)
                VALUES (tenant, operation_id, 1, now, 'claimed', principal, NULL, 'pending', 1, doc,
                        genesis, claimed_hash),
                       (tenant, operation_id, 2, now, 'submitted', principal, 'pending', 'submitted', 1,
                        submitted_doc, claimed_hash, submitted_hash);
                events := events || ledger.event_json('submitted', 'pending', 'submitted', 1);
            ELSE
                INSERT INTO ledger.events (
                    tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, data,
                    prev_hash, hash)
                VALUES (tenant, operation_id, 1, now, 'claimed', principal, NULL, 'pending', 1, doc,
                        genesis, claimed_hash);
            END IF;
            IF gate_outcome = 'approved' THEN  -- consumed by this attempt, in this transaction
                PERFORM ledger.approval_write(gate.approval, gate.events);
                approval := to_jsonb(gate.approval);
            END IF;
            outcome := 'created';
            RETURN;
        END IF;
        events := '[]';
        gate_outcome := NULL;  -- lost the insert: the approval stays unconsumed
        approval_data := '';
        FOR locked IN 0..1 LOOP
            IF locked = 1 THEN
                SELECT * INTO op FROM ledger.operations AS o
                WHERE o.tenant_id = claim.tenant AND o.operation_id = claim.operation_id
                FOR UPDATE;
                EXIT WHEN op.tenant_id IS NULL;
            END IF;
            db_now := clock_timestamp();
            outcome := CASE
                WHEN (op.principal, op.tool, op.tool_version, op.intent_digest)
                     IS DISTINCT FROM (principal, tool, tool_version, intent_digest) THEN 'intent_conflict'
                WHEN op.status = 'committed' THEN 'reuse_receipt'
                WHEN op.status IN ('pending', 'submitted') AND COALESCE(op.lease_expires_at > db_now, false) THEN
                    CASE WHEN nonce_hash IS NOT NULL AND op.client_nonce_hash = nonce_hash THEN 'replay'
                         ELSE 'operation_in_progress' END
                WHEN op.status NOT IN ('pending', 'not_applied') THEN 'outcome_unknown'
                ELSE 'new_attempt'
            END;
            IF outcome <> 'new_attempt' THEN
                RETURN;
            END IF;
        END LOOP;
        CONTINUE WHEN op.tenant_id IS NULL;  -- purged between the two reads
        -- A new attempt of an existing ID under a policy: the gate, under the row lock, nothing written yet.
        IF approval_policy IS NOT NULL THEN
            SELECT g.* INTO gate FROM ledger.approval_gate(
                tenant, operation_id, principal, tool, tool_version, intent_digest,
                approval_policy, false, op.attempt + 1, db_now) AS g;
            gate_outcome := gate.outcome;
            expired_here := expired_here + gate.expired;
            IF gate_outcome <> 'approved' THEN
                outcome := CASE gate_outcome WHEN 'retry' THEN 'vanished'
                                             WHEN 'approval_denied' THEN 'approval_denied'
                                             ELSE 'approval_required' END;
                approval := to_jsonb(gate.approval) || jsonb_build_object('expired_here', expired_here);
                RETURN;
            END IF;
            approval_data := gate.chain_data || ',';
        END IF;
        -- A new attempt: pending again with a new token and lease, no outcome; the old token is stale.
        now := date_trunc('milliseconds', db_now);
        lease_end := now + make_interval(secs => lease_seconds);
        e := ledger.append_event(tenant, operation_id, op.chain_seq + 1, op.chain_hash, now, 'reclaimed', principal,
            op.status, 'pending', op.attempt + 1,
            '{' || approval_data || '"lease_expires_at":' || ledger.jcs_string(ledger.ts_text(lease_end))
            || ',"previous_attempt":' || op.attempt::text || '}');
        events := jsonb_build_array(e);
        IF submit THEN
            e := ledger.append_event(tenant, operation_id, op.chain_seq + 2, e ->> 'hash', now, 'submitted',
                                     op.principal, 'pending', 'submitted', op.attempt + 1,
                                     ledger.submitted_data(effect_ref, lease_end));
            events := events || e;
        END IF;
        UPDATE ledger.operations AS t SET
            status = CASE WHEN submit THEN 'submitted' ELSE 'pending' END,
            attempt = t.attempt + 1, claim_token_hash = claim.token_hash, client_nonce_hash = claim.nonce_hash,
            sealed_token = claim.sealed_token, lease_seconds = claim.lease_seconds, lease_expires_at = lease_end,
            effect_ref = CASE WHEN submit THEN claim.effect_ref END, receipt = NULL, not_applied_reason = NULL,
            updated_at = now, submitted_at = CASE WHEN submit THEN now END, resolved_at = NULL,
            resolved_by = NULL, chain_seq = (e ->> 'seq')::integer, chain_hash = e ->> 'hash'
        WHERE t.tenant_id = claim.tenant AND t.operation_id = claim.operation_id
        RETURNING * INTO op;
        IF gate_outcome = 'approved' THEN  -- consumed by this attempt, in this transaction
            PERFORM ledger.approval_write(gate.approval, gate.events);
            approval := to_jsonb(gate.approval);
        END IF;
        RETURN;
    END LOOP;
    outcome := 'vanished';
    op := NULL;
    events := '[]';
END
$$;
