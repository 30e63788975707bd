"""The ledger: roles, operations, hash-chained events, protected diagnostics, row-level security.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from effect_ledger.db.migrate import execute_script

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ROLES = r"""
-- Roles are cluster-wide. Create them when this login may; on a managed PostgreSQL where it may
-- not, an administrator runs the two CREATE ROLE statements of the README first.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'effect_ledger_runtime') THEN
        CREATE ROLE effect_ledger_runtime LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS NOINHERIT;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'effect_ledger_diag_reader') THEN
        CREATE ROLE effect_ledger_diag_reader LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS NOINHERIT;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE EXCEPTION 'effect-ledger cannot create its roles here; create effect_ledger_runtime and '
        'effect_ledger_diag_reader first (README: Managed PostgreSQL)';
END
$$;
"""

LEDGER = r"""
CREATE SCHEMA ledger;
REVOKE ALL ON SCHEMA ledger FROM PUBLIC;

CREATE TABLE ledger.operations (
    tenant_id          text        NOT NULL,
    operation_id       text        NOT NULL CHECK (operation_id ~ '^[A-Za-z0-9._:~-]{1,200}$'),
    principal          text        NOT NULL,
    tool               text        NOT NULL,
    tool_version       text        NOT NULL,
    intent_digest      text        NOT NULL CHECK (intent_digest ~ '^sha256:[0-9a-f]{64}$'),
    status             text        NOT NULL
        CHECK (status IN ('pending', 'submitted', 'committed', 'not_applied', 'unknown')),
    attempt            integer     NOT NULL CHECK (attempt >= 1),
    claim_token_hash   bytea       NOT NULL,
    client_nonce_hash  bytea,
    sealed_token       bytea,
    lease_seconds      integer     NOT NULL CHECK (lease_seconds BETWEEN 1 AND 3600),
    lease_expires_at   timestamptz,
    effect_ref         text,
    receipt            jsonb,
    not_applied_reason jsonb,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    submitted_at       timestamptz,
    resolved_at        timestamptz,
    resolved_by        text,
    PRIMARY KEY (tenant_id, operation_id),
    CHECK (status <> 'committed' OR receipt IS NOT NULL),
    CHECK (status <> 'not_applied' OR not_applied_reason IS NOT NULL)
);

-- Reconciler list: by tenant and status in creation order (immutable, so pages never shift).
CREATE INDEX operations_by_status ON ledger.operations (tenant_id, status, created_at, operation_id);
-- Every operation in creation order, for the unfiltered list.
CREATE INDEX operations_by_created ON ledger.operations (tenant_id, created_at, operation_id);
-- Receipts feed: committed operations by resolution time.
CREATE INDEX operations_receipts ON ledger.operations (tenant_id, resolved_at, operation_id)
    WHERE status = 'committed';
-- Sweeper: submitted operations by lease end, across tenants.
CREATE INDEX operations_submitted_lease ON ledger.operations (lease_expires_at)
    WHERE status = 'submitted';
-- Purge: terminal operations by last change, across tenants.
CREATE INDEX operations_terminal_age ON ledger.operations (updated_at)
    WHERE status IN ('committed', 'not_applied');

CREATE TABLE ledger.events (
    tenant_id    text        NOT NULL,
    operation_id text        NOT NULL,
    seq          integer     NOT NULL CHECK (seq >= 1),
    at           timestamptz NOT NULL,
    kind         text        NOT NULL,
    actor        text        NOT NULL,
    from_status  text,
    to_status    text,
    attempt      integer     NOT NULL,
    data         jsonb       NOT NULL,
    prev_hash    text        NOT NULL CHECK (prev_hash ~ '^[0-9a-f]{64}$'),
    hash         text        NOT NULL CHECK (hash ~ '^[0-9a-f]{64}$'),
    PRIMARY KEY (tenant_id, operation_id, seq),
    FOREIGN KEY (tenant_id, operation_id) REFERENCES ledger.operations (tenant_id, operation_id)
);

-- Append-only at the database: UPDATE and TRUNCATE are refused for everyone, DELETE for everyone
-- but the purge path, which sets effect_ledger.purge in its own transaction.
CREATE FUNCTION ledger.refuse_event_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('effect_ledger.purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'ledger.events is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON ledger.events
    FOR EACH ROW EXECUTE FUNCTION ledger.refuse_event_change();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON ledger.events
    FOR EACH STATEMENT EXECUTE FUNCTION ledger.refuse_event_change();

ALTER TABLE ledger.operations ENABLE ROW LEVEL SECURITY;
ALTER TABLE ledger.operations FORCE ROW LEVEL SECURITY;
ALTER TABLE ledger.events ENABLE ROW LEVEL SECURITY;
ALTER TABLE ledger.events FORCE ROW LEVEL SECURITY;
-- No tenant set means current_setting(..., true) is NULL or '', which matches no row.
CREATE POLICY tenant_isolation ON ledger.operations
    USING (tenant_id = current_setting('effect_ledger.tenant', true))
    WITH CHECK (tenant_id = current_setting('effect_ledger.tenant', true));
CREATE POLICY tenant_isolation ON ledger.events
    USING (tenant_id = current_setting('effect_ledger.tenant', true))
    WITH CHECK (tenant_id = current_setting('effect_ledger.tenant', true));

GRANT USAGE ON SCHEMA ledger TO effect_ledger_runtime;
GRANT SELECT, INSERT, UPDATE ON ledger.operations TO effect_ledger_runtime;
GRANT SELECT, INSERT ON ledger.events TO effect_ledger_runtime;
"""

DIAGNOSTICS = r"""
CREATE SCHEMA diagnostics;
REVOKE ALL ON SCHEMA diagnostics FROM PUBLIC;

CREATE TABLE diagnostics.incidents (
    tenant_id           text        NOT NULL,
    incident_id         text        NOT NULL CHECK (incident_id ~ '^inc_[A-Za-z0-9_-]{16,64}$'),
    created_at          timestamptz NOT NULL DEFAULT now(),
    source              text        NOT NULL CHECK (source IN ('report', 'error', 'outcome')),
    principal           text,
    operation_id        text,
    attempt             integer,
    phase               text,
    cause               text,
    http_status         integer,
    provider            text,
    provider_request_id text,
    retryable_hint      boolean,
    elapsed_ms          bigint,
    detail_code         text,
    headers             jsonb,
    route               text,
    method              text,
    exception_type      text,
    PRIMARY KEY (tenant_id, incident_id)
);
CREATE INDEX incidents_age ON diagnostics.incidents (created_at);

CREATE TABLE diagnostics.access_log (
    tenant_id   text        NOT NULL,
    access_id   text        NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    incident_id text        NOT NULL,
    principal   text        NOT NULL,
    purpose     text        NOT NULL,
    PRIMARY KEY (tenant_id, access_id)
);
CREATE INDEX access_log_by_time ON diagnostics.access_log (tenant_id, at, access_id);
CREATE INDEX access_log_age ON diagnostics.access_log (at);

ALTER TABLE diagnostics.incidents ENABLE ROW LEVEL SECURITY;
ALTER TABLE diagnostics.incidents FORCE ROW LEVEL SECURITY;
ALTER TABLE diagnostics.access_log ENABLE ROW LEVEL SECURITY;
ALTER TABLE diagnostics.access_log FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON diagnostics.incidents
    USING (tenant_id = current_setting('effect_ledger.tenant', true))
    WITH CHECK (tenant_id = current_setting('effect_ledger.tenant', true));
CREATE POLICY tenant_isolation ON diagnostics.access_log
    USING (tenant_id = current_setting('effect_ledger.tenant', true))
    WITH CHECK (tenant_id = current_setting('effect_ledger.tenant', true));

-- The runtime role writes incidents but can never read them back; auditors read the access log
-- through it. The reader role reads incidents and appends to the access log, nothing else.
GRANT USAGE ON SCHEMA diagnostics TO effect_ledger_runtime, effect_ledger_diag_reader;
GRANT INSERT ON diagnostics.incidents TO effect_ledger_runtime;
GRANT SELECT ON diagnostics.access_log TO effect_ledger_runtime;
GRANT SELECT ON diagnostics.incidents TO effect_ledger_diag_reader;
GRANT INSERT ON diagnostics.access_log TO effect_ledger_diag_reader;
"""


def upgrade() -> None:
    """Create roles (when allowed), the ledger schema and the diagnostics schema."""
    for script in (ROLES, LEDGER, DIAGNOSTICS):
        execute_script(script)


def downgrade() -> None:
    """Migrations are forward-only: an audit ledger is never rolled back by dropping it."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
