"""Approvals (API.md section 15): authority bound to one exact binding, valid until the database clock
says otherwise, consumed by exactly one attempt in the claim's own transaction.

ledger.approvals holds one row per approval request, bound to (tenant, operation_id, principal, tool,
tool_version, intent_digest). At most one request of a binding is *live* (pending, approved or denied):
a partial unique index says so, and an INSERT ... ON CONFLICT DO NOTHING learns who requested first.
Every change of a request is an event of its own hash chain (ledger.approval_events, append-only like
ledger.events), hashed as sha256_hex(prev_hash + "\\n" + JCS({"actor", "approval_id", "at", "data",
"kind", "seq"})) from the genesis hash (domain/approvals.approval_event_hash checks it).

The gate: ledger.approval_gate(...) locks the binding's live request (FOR UPDATE, so concurrent claims
of one approval queue on it), expires it by the database clock, requests a new one where there is
none, and says whether this attempt may go: `approved` hands back the request already *consumed* in
memory, with its events and the approval's part of the `claimed` event's data; the claim writes it
(ledger.approval_write) only once its attempt is granted, in the same transaction. ledger.claim calls
the gate only when the service passes a policy (`approval_policy`, NULL when no rule covers the tool):
an ungated claim costs one IS NULL test more than before. ledger.claim itself, gate included, is
defined in alembic/functions/10_claim.sql.

Decide and revoke are one statement each (ledger.approval_decide, ledger.approval_revoke).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from effect_ledger.db.migrate import (
    apply_functions,
    distribute_by_tenant,
    distribute_functions,
    execute_script,
)

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TABLES = r"""
CREATE TABLE ledger.approvals (
    tenant_id           text        NOT NULL,
    approval_id         text        NOT NULL CHECK (approval_id ~ '^apr_[0-9a-f]{32}$'),
    operation_id        text        NOT NULL,
    principal           text        NOT NULL,
    tool                text        NOT NULL,
    tool_version        text        NOT NULL,
    intent_digest       text        NOT NULL CHECK (intent_digest ~ '^sha256:[0-9a-f]{64}$'),
    intent              jsonb,
    note                text        CHECK (char_length(note) <= 2000),
    status              text        NOT NULL
        CHECK (status IN ('pending', 'approved', 'denied', 'revoked', 'expired', 'consumed')),
    required            integer     NOT NULL CHECK (required BETWEEN 1 AND 3),
    decisions           jsonb       NOT NULL,
    requested_at        timestamptz NOT NULL,
    expires_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    consumed_by_attempt integer,
    chain_seq           integer     NOT NULL CHECK (chain_seq >= 1),
    chain_hash          text        NOT NULL CHECK (chain_hash ~ '^[0-9a-f]{64}$'),
    PRIMARY KEY (tenant_id, approval_id)
);
-- One live request per binding: the gate's lock target, and the arbiter of concurrent first claims.
CREATE UNIQUE INDEX approvals_live_binding
    ON ledger.approvals (tenant_id, operation_id, principal, tool, tool_version, intent_digest)
    WHERE status IN ('pending', 'approved', 'denied');
-- The approvers' queue and list, oldest first (requested_at never changes, so pages never shift).
CREATE INDEX approvals_by_requested ON ledger.approvals (tenant_id, requested_at, approval_id);
-- Retention: requests whose intent is still stored, by expiry, across tenants.
CREATE INDEX approvals_stored_intent ON ledger.approvals (expires_at) WHERE intent IS NOT NULL;

CREATE TABLE ledger.approval_events (
    tenant_id   text        NOT NULL,
    approval_id text        NOT NULL,
    seq         integer     NOT NULL CHECK (seq >= 1),
    at          timestamptz NOT NULL,
    kind        text        NOT NULL
        CHECK (kind IN ('requested', 'approved', 'denied', 'revoked', 'expired', 'consumed')),
    actor       text        NOT NULL,
    data        jsonb       NOT NULL,
    prev_hash   text        NOT NULL CHECK (prev_hash ~ '^[0-9a-f]{64}$'),
    hash        text        NOT NULL CHECK (hash ~ '^[0-9a-f]{64}$'),
    PRIMARY KEY (tenant_id, approval_id, seq),
    FOREIGN KEY (tenant_id, approval_id) REFERENCES ledger.approvals (tenant_id, approval_id)
);
-- Append-only, with the purge path's exception: 0001's trigger function.
CREATE TRIGGER approval_events_append_only BEFORE UPDATE OR DELETE ON ledger.approval_events
    FOR EACH ROW EXECUTE FUNCTION ledger.refuse_event_change();
CREATE TRIGGER approval_events_no_truncate BEFORE TRUNCATE ON ledger.approval_events
    FOR EACH STATEMENT EXECUTE FUNCTION ledger.refuse_event_change();

ALTER TABLE ledger.approvals ENABLE ROW LEVEL SECURITY;
ALTER TABLE ledger.approvals FORCE ROW LEVEL SECURITY;
ALTER TABLE ledger.approval_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE ledger.approval_events FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON ledger.approvals
    USING (tenant_id = current_setting('effect_ledger.tenant', true))
    WITH CHECK (tenant_id = current_setting('effect_ledger.tenant', true));
CREATE POLICY tenant_isolation ON ledger.approval_events
    USING (tenant_id = current_setting('effect_ledger.tenant', true))
    WITH CHECK (tenant_id = current_setting('effect_ledger.tenant', true));
CREATE POLICY maintenance ON ledger.approvals TO CURRENT_USER
    USING (current_setting('effect_ledger.maintenance', true) = 'on');
CREATE POLICY maintenance ON ledger.approval_events TO CURRENT_USER
    USING (current_setting('effect_ledger.maintenance', true) = 'on');
GRANT SELECT, INSERT, UPDATE ON ledger.approvals TO effect_ledger_runtime;
GRANT SELECT, INSERT ON ledger.approval_events TO effect_ledger_runtime;
"""

FUNCTIONS = r"""
-- Number and hash one event onto the request's chain head (moving the head) and queue it in `events`.
-- `data` is the event's data in JCS text; the keys of `content` are in JCS order.
CREATE PROCEDURE ledger.approval_event(
    INOUT a ledger.approvals, INOUT events jsonb, event_at timestamptz, kind text, actor text, data text)
LANGUAGE plpgsql AS $$
DECLARE
    seq integer := COALESCE(a.chain_seq, 0) + 1;
    prev text := COALESCE(a.chain_hash, repeat('0', 64));
    content text := '{"actor":' || ledger.jcs_string(actor)
        || ',"approval_id":' || ledger.jcs_string(a.approval_id)
        || ',"at":' || ledger.jcs_string(ledger.ts_text(event_at)) || ',"data":' || data
        || ',"kind":' || ledger.jcs_string(kind) || ',"seq":' || seq::text || '}';
    digest text := encode(sha256(convert_to(prev || E'\n' || content, 'UTF8')), 'hex');
BEGIN
    events := events || jsonb_build_object(
        'seq', seq, 'at', event_at, 'kind', kind, 'actor', actor, 'data', data::jsonb,
        'prev_hash', prev, 'hash', digest);
    a.chain_seq := seq;
    a.chain_hash := digest;
    a.updated_at := event_at;
END
$$;

-- Append queued approval events (after the request row exists: the foreign key). Row by row, as
-- 0008's ledger.append_events, so that Citus can route each insert.
CREATE FUNCTION ledger.approval_append(a ledger.approvals, events jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    e record;
BEGIN
    FOR e IN
        SELECT * FROM jsonb_to_recordset(events) AS r(
            seq integer, at timestamptz, kind text, actor text, data jsonb, prev_hash text, hash text)
    LOOP
        INSERT INTO ledger.approval_events (tenant_id, approval_id, seq, at, kind, actor, data, prev_hash, hash)
        VALUES (a.tenant_id, a.approval_id, e.seq, e.at, e.kind, e.actor, e.data, e.prev_hash, e.hash);
    END LOOP;
END
$$;

-- Write a request's new state and chain head, then its queued events.
CREATE FUNCTION ledger.approval_write(a ledger.approvals, events jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ledger.approvals AS t SET
        (status, decisions, updated_at, consumed_by_attempt, chain_seq, chain_hash)
      = (a.status, a.decisions, a.updated_at, a.consumed_by_attempt, a.chain_seq, a.chain_hash)
    WHERE t.tenant_id = a.tenant_id AND t.approval_id = a.approval_id;
    IF jsonb_array_length(events) > 0 THEN
        PERFORM ledger.approval_append(a, events);
    END IF;
END
$$;

-- A live request (pending, approved, denied) whose expires_at has passed at `clock` is expired:
-- record it (an `expired` event) and write it. Whether it was due is returned.
CREATE PROCEDURE ledger.approval_expire_if_due(INOUT a ledger.approvals, clock timestamptz, INOUT expired boolean)
LANGUAGE plpgsql AS $$
DECLARE
    events jsonb := '[]';
BEGIN
    expired := a.status IN ('pending', 'approved', 'denied') AND a.expires_at <= clock;
    IF expired THEN
        a.status := 'expired';
        CALL ledger.approval_event(a, events, date_trunc('milliseconds', clock), 'expired', 'effect-ledger',
            '{"expires_at":' || ledger.jcs_string(ledger.ts_text(a.expires_at)) || '}');
        PERFORM ledger.approval_write(a, events);
    END IF;
END
$$;

-- Maintenance (owner, one tenant): expire up to `batch` live requests past their validity, each with
-- its `expired` event. Rows a claim or a decision holds are skipped (they expire it themselves).
CREATE FUNCTION ledger.expire_approvals(tenant text, batch integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    a ledger.approvals;
    gone boolean;
    n integer := 0;
BEGIN
    PERFORM tenancy.bind_setting('effect_ledger.tenant', tenant);
    FOR a IN
        SELECT * FROM ledger.approvals AS t
        WHERE t.tenant_id = expire_approvals.tenant AND t.status IN ('pending', 'approved', 'denied')
          AND t.expires_at <= clock_timestamp()
        ORDER BY t.expires_at
        LIMIT batch
        FOR UPDATE SKIP LOCKED
    LOOP
        gone := false;
        CALL ledger.approval_expire_if_due(a, clock_timestamp(), gone);
        IF gone THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END
$$;

-- The approvers of a request in decision order, as a JCS array of strings (to_json: jcs_string's
-- escaping; not jcs_string itself, which a schema dump creates after this SQL function's body is checked).
CREATE FUNCTION ledger.approvers_jcs(decisions jsonb) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT '[' || COALESCE(string_agg(to_json(d ->> 'by')::text, ',' ORDER BY n), '') || ']'
    FROM jsonb_array_elements(decisions) WITH ORDINALITY AS x(d, n)
    WHERE d ->> 'decision' = 'approve'
$$;

-- The approval gate of a claim that would grant attempt `attempt` (API.md section 15), inside the
-- claim's transaction, at the database clock `clock`. `policy`: {"approval_id" (for a new request),
-- "required", "ttl_seconds", "note", "intent"}. Outcomes:
--   approved           the live request is approved and unexpired: `approval` is it, consumed by
--                      `attempt` in memory (status, events queued in `events`), `chain_data` the
--                      `"approval":{...}` member for the claimed event. The caller writes it with
--                      ledger.approval_write once its attempt is granted; the row stays locked.
--   approval_required  pending (found, or requested now: the `requested` event is written)
--   approval_denied    denied and unexpired
--   retry              `new_id` and the operation appeared while we waited for the request's lock
--                      (a concurrent claim consumed the approval and created it): decide again.
CREATE FUNCTION ledger.approval_gate(
    tenant text, operation_id text, principal text, tool text, tool_version text, intent_digest text,
    policy jsonb, new_id boolean, attempt integer, clock timestamptz,
    OUT outcome text, OUT approval ledger.approvals, OUT events jsonb, OUT chain_data text)
LANGUAGE plpgsql AS $$
DECLARE
    now timestamptz := date_trunc('milliseconds', clock);
    found_live boolean;
    gone boolean := false;
BEGIN
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

-- An approver's decision (API.md section 15), one statement. outcome: decided | unchanged |
-- not_found | forbidden (the requester) | conflicting_outcome (this approver decided otherwise) |
-- invalid_transition (not pending).
CREATE FUNCTION ledger.approval_decide(
    tenant text, approval_id text, actor text, decision text, reason text,
    OUT outcome text, OUT approval ledger.approvals, OUT db_now timestamptz, OUT events jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    prior jsonb;
    now timestamptz;
    yes_count integer;
    gone boolean := false;
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
    CALL ledger.approval_event(approval, events, now, CASE decision WHEN 'deny' THEN 'denied' ELSE 'approved' END,
        actor, '{"approvals":' || yes_count::text || ',"reason":' || ledger.jcs_string(reason)
        || ',"required":' || approval.required::text || ',"status":' || ledger.jcs_string(approval.status) || '}');
    PERFORM ledger.approval_write(approval, events);
    outcome := 'decided';
END
$$;

-- Revoke a request (API.md section 15), one statement. outcome: revoked | unchanged (already
-- revoked) | not_found | invalid_transition (consumed).
CREATE FUNCTION ledger.approval_revoke(
    tenant text, approval_id text, actor text, reason text,
    OUT outcome text, OUT approval ledger.approvals, OUT db_now timestamptz, OUT events jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    gone boolean := false;
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
    IF approval.status = 'consumed' THEN
        outcome := 'invalid_transition';
        RETURN;
    END IF;
    IF approval.status = 'revoked' THEN
        outcome := 'unchanged';
        RETURN;
    END IF;
    approval.status := 'revoked';
    CALL ledger.approval_event(approval, events, date_trunc('milliseconds', db_now), 'revoked', actor,
        '{"reason":' || ledger.jcs_string(reason) || '}');
    PERFORM ledger.approval_write(approval, events);
    outcome := 'revoked';
END
$$;
"""

# ledger.claim with its gate lives in alembic/functions/10_claim.sql (applied by 0009 and again here):
# it gained one argument (approval_policy, NULL = no rule covers the tool) and one result (approval),
# so the old signature goes.
OLD_CLAIM = (
    "DROP FUNCTION IF EXISTS ledger.claim("
    "text, text, text, text, text, text, integer, bytea, bytea, bytea, boolean, text)"
)

DISTRIBUTED_FUNCTIONS = (
    "ledger.claim(text, text, text, text, text, text, integer, bytea, bytea, bytea, boolean, text, jsonb)",
    "ledger.approval_decide(text, text, text, text, text)",
    "ledger.approval_revoke(text, text, text, text)",
)


def upgrade() -> None:
    """The approvals tables, their functions, and ledger.claim with its gate."""
    execute_script(TABLES)
    distribute_by_tenant("ledger.approvals", "ledger.approval_events")
    execute_script(FUNCTIONS)
    execute_script(OLD_CLAIM)
    apply_functions()
    distribute_functions(*DISTRIBUTED_FUNCTIONS, tenant_argument="tenant", force_delegation=False)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
