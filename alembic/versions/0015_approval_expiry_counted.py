"""Every approval expiry is counted (API.md section 15: "counted in the metrics"), also the ones a
claim, a decision or a revocation finds and records itself (issue 25).

A request past its `expires_at` is expired by whoever locks it first: the sweep (counted), or inline,
by `ledger.approval_expire_if_due` inside the claim's gate, `approval_decide` or `approval_revoke`,
whose `expired` event commits with that call but was not among what the call reported. Now:
- `ledger.approval_gate` gains `OUT expired integer`, the requests it expired (the claim hands the sum
  back as `expired_here` in its `approval` result, alembic/functions/10_claim.sql);
- `approval_decide` and `approval_revoke` report in `events` every event the call committed, the
  inline `expired` first (their signatures are unchanged: Citus keeps their distribution).
The service counts them in `effect_ledger_approvals_total{event="expired"}`.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from effect_ledger.db.migrate import apply_functions, execute_script

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

OLD_GATE = (
    "DROP FUNCTION ledger.approval_gate("
    "text, text, text, text, text, text, jsonb, boolean, integer, timestamptz)"
)

GATE = """
CREATE FUNCTION ledger.approval_gate(
    tenant text, operation_id text, principal text, tool text, tool_version text, intent_digest text,
    policy jsonb, new_id boolean, attempt integer, clock timestamptz,
    OUT outcome text, OUT approval ledger.approvals, OUT events jsonb, OUT chain_data text,
    OUT expired integer)
LANGUAGE plpgsql AS $$
DECLARE
    now timestamptz := date_trunc('milliseconds', clock);
    found_live boolean;
    gone boolean := false;
BEGIN
    expired := 0;
    FOR round IN 1..3 LOOP
        events := '[]';
        -- FOR UPDATE: concurrent claims of one approval queue here; a waiter re-reads the row after
        -- the holder commits and skips it if it is no longer live (consumed, say).
        SELECT * INTO approval FROM ledger.approvals AS a
        WHERE a.tenant_id = approval_gate.tenant AND a.operation_id = approval_gate.operation_id
          AND a.principal = approval_gate.principal AND a.tool = approval_gate.tool
          AND a.tool_version = approval_gate.tool_version AND a.intent_digest = approval_gate.intent_digest
          AND a.status IN ('pending', 'approved', 'denied')
        FOR UPDATE;
        found_live := FOUND;
        IF found_live THEN
            CALL ledger.approval_expire_if_due(approval, clock, gone);
            found_live := NOT gone;
            IF gone THEN
                expired := expired + 1;  -- its `expired` event is committed with this transaction
            END IF;
        END IF;
        IF found_live THEN
            IF approval.status = 'approved' THEN
                approval.status := 'consumed';
                approval.consumed_by_attempt := attempt;
                CALL ledger.approval_event(approval, events, now, 'consumed', principal,
                    '{"attempt":' || attempt::text
                    || ',"operation_id":' || ledger.jcs_string(operation_id) || '}');
                chain_data := '"approval":{"approval_id":' || ledger.jcs_string(approval.approval_id)
                    || ',"approvers":' || ledger.approvers_jcs(approval.decisions) || '}';
                outcome := 'approved';
            ELSIF approval.status = 'denied' THEN
                outcome := 'approval_denied';
            ELSE
                outcome := 'approval_required';
            END IF;
            RETURN;
        END IF;
        IF new_id AND EXISTS (SELECT 1 FROM ledger.operations AS o
                              WHERE o.tenant_id = approval_gate.tenant
                                AND o.operation_id = approval_gate.operation_id) THEN
            outcome := 'retry';
            RETURN;
        END IF;
        -- No live request: request one (the first concurrent claim's insert wins; the others lock it).
        approval := NULL;
        approval.tenant_id := tenant;
        approval.approval_id := policy ->> 'approval_id';
        approval.operation_id := operation_id;
        approval.principal := principal;
        approval.tool := tool;
        approval.tool_version := tool_version;
        approval.intent_digest := intent_digest;
        approval.intent := policy -> 'intent';  -- absent when the claim sent only intent_digest
        approval.note := policy ->> 'note';
        approval.status := 'pending';
        approval.required := (policy ->> 'required')::integer;
        approval.decisions := '[]';
        approval.requested_at := now;
        approval.expires_at := now + make_interval(secs => (policy ->> 'ttl_seconds')::integer);
        CALL ledger.approval_event(approval, events, now, 'requested', principal,
            '{"expires_at":' || ledger.jcs_string(ledger.ts_text(approval.expires_at))
            || ',"intent_digest":' || ledger.jcs_string(intent_digest)
            || ',"operation_id":' || ledger.jcs_string(operation_id)
            || ',"required":' || approval.required::text
            || ',"tool":' || ledger.jcs_string(tool)
            || ',"tool_version":' || ledger.jcs_string(tool_version) || '}');
        INSERT INTO ledger.approvals SELECT approval.* ON CONFLICT DO NOTHING;
        -- Who won: as ledger.claim, by looking for our (random) ID, not by FOUND (Citus).
        IF EXISTS (SELECT 1 FROM ledger.approvals AS a
                   WHERE a.tenant_id = approval_gate.tenant AND a.approval_id = approval.approval_id) THEN
            PERFORM ledger.approval_append(approval, events);
            events := '[]';
            outcome := 'approval_required';
            RETURN;
        END IF;
    END LOOP;
    outcome := 'retry';
    approval := NULL;
END
$$;
"""

DECIDE = """
CREATE OR REPLACE FUNCTION ledger.approval_decide(
    tenant text, approval_id text, actor text, decision text, reason text,
    OUT outcome text, OUT approval ledger.approvals, OUT db_now timestamptz, OUT events jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    prior jsonb;
    now timestamptz;
    yes_count integer;
    gone boolean := false;
    written jsonb := '[]';
BEGIN
    PERFORM tenancy.bind_setting('effect_ledger.tenant', tenant);
    events := '[]';
    SELECT * INTO approval FROM ledger.approvals AS a
    WHERE a.tenant_id = approval_decide.tenant AND a.approval_id = approval_decide.approval_id
    FOR UPDATE;
    db_now := clock_timestamp();
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    CALL ledger.approval_expire_if_due(approval, db_now, gone);
    IF gone THEN  -- committed by approval_expire_if_due; `events` lists what this call committed
        events := '[{"kind":"expired"}]';
    END IF;
    IF approval.principal = actor THEN
        outcome := 'forbidden';
        RETURN;
    END IF;
    SELECT d INTO prior FROM jsonb_array_elements(approval.decisions) AS d WHERE d ->> 'by' = actor;
    IF prior IS NOT NULL THEN
        outcome := CASE WHEN prior ->> 'decision' = decision THEN 'unchanged' ELSE 'conflicting_outcome' END;
        RETURN;
    END IF;
    IF approval.status <> 'pending' THEN
        outcome := 'invalid_transition';
        RETURN;
    END IF;
    now := date_trunc('milliseconds', db_now);
    approval.decisions := approval.decisions || jsonb_build_array(jsonb_build_object(
        'by', actor, 'decision', decision, 'reason', reason, 'at', ledger.ts_text(now)));
    SELECT count(*) INTO yes_count FROM jsonb_array_elements(approval.decisions) AS d
    WHERE d ->> 'decision' = 'approve';
    IF decision = 'deny' THEN
        approval.status := 'denied';
    ELSIF yes_count >= approval.required THEN
        approval.status := 'approved';
    END IF;
    CALL ledger.approval_event(approval, written, now, CASE decision WHEN 'deny' THEN 'denied' ELSE 'approved' END,
        actor, '{"approvals":' || yes_count::text || ',"reason":' || ledger.jcs_string(reason)
        || ',"required":' || approval.required::text || ',"status":' || ledger.jcs_string(approval.status) || '}');
    PERFORM ledger.approval_write(approval, written);
    events := events || written;
    outcome := 'decided';
END
$$;
"""

REVOKE = """
CREATE OR REPLACE FUNCTION ledger.approval_revoke(
    tenant text, approval_id text, actor text, reason text,
    OUT outcome text, OUT approval ledger.approvals, OUT db_now timestamptz, OUT events jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    gone boolean := false;
    written jsonb := '[]';
BEGIN
    PERFORM tenancy.bind_setting('effect_ledger.tenant', tenant);
    events := '[]';
    SELECT * INTO approval FROM ledger.approvals AS a
    WHERE a.tenant_id = approval_revoke.tenant AND a.approval_id = approval_revoke.approval_id
    FOR UPDATE;
    db_now := clock_timestamp();
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    CALL ledger.approval_expire_if_due(approval, db_now, gone);
    IF gone THEN  -- committed by approval_expire_if_due; `events` lists what this call committed
        events := '[{"kind":"expired"}]';
    END IF;
    IF approval.status = 'consumed' THEN
        outcome := 'invalid_transition';
        RETURN;
    END IF;
    IF approval.status = 'revoked' THEN
        outcome := 'unchanged';
        RETURN;
    END IF;
    approval.status := 'revoked';
    CALL ledger.approval_event(approval, written, date_trunc('milliseconds', db_now), 'revoked', actor,
        '{"reason":' || ledger.jcs_string(reason) || '}');
    PERFORM ledger.approval_write(approval, written);
    events := events || written;
    outcome := 'revoked';
END
$$;
"""


def upgrade() -> None:
    """The gate with its count, decide and revoke reporting the inline expiry, and the claim that
    hands the gate's count back."""
    execute_script(OLD_GATE)
    execute_script(GATE)
    execute_script(DECIDE)
    execute_script(REVOKE)
    apply_functions()


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
