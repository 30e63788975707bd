-- ledger.heartbeat: a pending or live submitted lease runs to now + lease_seconds (default: the
-- attempt's lease length). No event. One statement, one round trip (db/ledger.heartbeat).
--
-- outcome (domain/outcomes.Outcome): extended | not_found | stale_claim | outcome_unknown
--   | invalid_transition (terminal)
CREATE OR REPLACE FUNCTION ledger.heartbeat(
    tenant text, operation_id text, token_hash bytea, lease_seconds integer,
    OUT outcome text, OUT op ledger.operations, OUT db_now timestamptz, OUT events jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    bound text;  -- ledger.bind_tenant's answer (unused)
    now timestamptz;
BEGIN
    events := '[]';
    bound := ledger.bind_tenant(tenant);
    SELECT * INTO op FROM ledger.operations AS t
    WHERE t.tenant_id = heartbeat.tenant AND t.operation_id = heartbeat.operation_id
    FOR UPDATE;
    db_now := clock_timestamp();
    outcome := CASE
        WHEN op.tenant_id IS NULL THEN 'not_found'
        WHEN op.claim_token_hash IS DISTINCT FROM token_hash THEN 'stale_claim'
        WHEN op.status = 'submitted' AND NOT COALESCE(op.lease_expires_at > db_now, false) THEN 'outcome_unknown'
        WHEN op.status = 'unknown' THEN 'outcome_unknown'
        WHEN op.status NOT IN ('pending', 'submitted') THEN 'invalid_transition'
        ELSE 'extended'
    END;
    IF outcome <> 'extended' THEN
        RETURN;
    END IF;
    now := date_trunc('milliseconds', db_now);
    UPDATE ledger.operations AS t SET
        lease_expires_at = now + make_interval(secs => COALESCE(heartbeat.lease_seconds, t.lease_seconds)),
        updated_at = now
    WHERE t.tenant_id = heartbeat.tenant AND t.operation_id = heartbeat.operation_id
    RETURNING * INTO op;
END
$$;
