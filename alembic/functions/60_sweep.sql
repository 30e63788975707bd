-- ledger.sweep: the sweeper's step for one submitted operation whose lease may have run out (run by
-- the owner, under the row's tenant): it becomes unknown with its `lease_expired` event.
--
-- outcome (domain/outcomes.Outcome): expired | unchanged | not_found
CREATE OR REPLACE FUNCTION ledger.sweep(
    tenant text, operation_id text,
    OUT outcome text, OUT op ledger.operations, OUT db_now timestamptz, OUT events jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    bound text;  -- ledger.bind_tenant's answer (unused)
    now timestamptz;
    e jsonb;
BEGIN
    events := '[]';
    bound := ledger.bind_tenant(tenant);
    SELECT * INTO op FROM ledger.operations AS t
    WHERE t.tenant_id = sweep.tenant AND t.operation_id = sweep.operation_id
    FOR UPDATE;
    db_now := clock_timestamp();
    outcome := CASE
        WHEN op.tenant_id IS NULL THEN 'not_found'
        WHEN op.status = 'submitted' AND NOT COALESCE(op.lease_expires_at > db_now, false) THEN 'expired'
        ELSE 'unchanged'
    END;
    IF outcome <> 'expired' THEN
        RETURN;
    END IF;
    now := date_trunc('milliseconds', db_now);
    e := ledger.append_event(tenant, operation_id, op.chain_seq + 1, op.chain_hash, now, 'lease_expired',
                             'effect-ledger', 'submitted', 'unknown', op.attempt, ledger.lease_data(op.lease_expires_at));
    events := jsonb_build_array(e);
    UPDATE ledger.operations AS t SET
        status = 'unknown', updated_at = now, chain_seq = t.chain_seq + 1, chain_hash = e ->> 'hash'
    WHERE t.tenant_id = sweep.tenant AND t.operation_id = sweep.operation_id
    RETURNING * INTO op;
END
$$;
