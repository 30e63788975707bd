"""Promises that hold over time and for every reader (issue 13): idempotent diagnostics reports, a
gap-free receipts feed, and tombstones that keep a purged ID from ever being executed again.

Diagnostics: an incident may carry the SHA-256 of its `report_id` and a fingerprint of its fields;
a unique constraint per (tenant, principal, report key) makes a repeated report lose its INSERT. The
runtime role still cannot SELECT incidents: it stores such a report through `diagnostics.store_report`,
a SECURITY DEFINER function that answers the first incident's reference and whether the
fingerprints match, never a stored value.

Feed: committed operations get `feed_position` after they commit, from a per-tenant counter row
(`ledger.feed_counters`) locked FOR UPDATE by whoever assigns positions (the feed read itself), so
positions are handed out in one order to rows already committed and visible (docs/retention-and-feed.md).

Tombstones: a purge keeps the operation row (binding, final status, attempt, chain head) and drops
only its events, receipt body and reason, recording the receipt's digest and the chain point it
purged through; `TOMBSTONE_DAYS` after its last change the row itself goes. Keeping the row means a claim racing the purge meets the same row lock
and primary key as ever: there is no moment at which the ID is absent.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from effect_ledger.db.migrate import distribute_by_tenant, execute_script

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# Columns first, then each constraint under its name (the one PostgreSQL would have chosen), one
# ADD/DROP CONSTRAINT per script: Citus refuses unnamed constraints on ADD COLUMN and ADD CONSTRAINT
# beside other subcommands, and forwards it to the workers as written (0004's pattern, docs/citus.md).
DIAGNOSTICS = (
    r"""
ALTER TABLE diagnostics.incidents
    ADD COLUMN report_key bytea,
    ADD COLUMN report_fingerprint bytea
""",
    "ALTER TABLE diagnostics.incidents"
    " ADD CONSTRAINT incidents_report_key_check CHECK (octet_length(report_key) = 32)",
    "ALTER TABLE diagnostics.incidents"
    " ADD CONSTRAINT incidents_report_fingerprint_check CHECK (octet_length(report_fingerprint) = 32)",
    "ALTER TABLE diagnostics.incidents"
    " ADD CONSTRAINT incidents_report_once UNIQUE (tenant_id, principal, report_key)",
)

STORE_REPORT = r"""
-- A report with a report_id is stored through this function, which runs as the owner: INSERT ...
-- ON CONFLICT needs SELECT on the arbiter's columns, which the runtime role must never have. It
-- answers only a reference and two verdicts, never a stored value. The tenant comes from the
-- caller's transaction and is named in every statement, so even with maintenance scope switched on
-- (policy `maintenance`) it never touches another tenant. Each statement of a plpgsql function takes
-- a fresh snapshot: after the INSERT waited for a concurrent first report and lost, the SELECT sees it.
CREATE FUNCTION diagnostics.store_report(
    p_incident_id text, p_principal text, p_report_key bytea, p_fingerprint bytea,
    p_operation_id text, p_attempt integer, p_phase text, p_cause text, p_http_status integer,
    p_provider text, p_provider_request_id text, p_retryable_hint boolean, p_elapsed_ms bigint,
    p_detail_code text, p_headers jsonb)
RETURNS TABLE (first_incident text, stored boolean, same_fields boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tenant constant text := current_setting('effect_ledger.tenant', true);
BEGIN
    INSERT INTO diagnostics.incidents (
        tenant_id, incident_id, source, principal, operation_id, attempt, phase, cause, http_status,
        provider, provider_request_id, retryable_hint, elapsed_ms, detail_code, headers, created_at,
        report_key, report_fingerprint)
    VALUES (v_tenant, p_incident_id, 'report', p_principal, p_operation_id, p_attempt, p_phase, p_cause,
            p_http_status, p_provider, p_provider_request_id, p_retryable_hint, p_elapsed_ms, p_detail_code,
            p_headers, clock_timestamp(), p_report_key, p_fingerprint)
    ON CONFLICT ON CONSTRAINT incidents_report_once DO NOTHING;
    IF FOUND THEN
        RETURN QUERY SELECT p_incident_id, true, true;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT i.incident_id, false, i.report_fingerprint = p_fingerprint
        FROM diagnostics.incidents AS i
        WHERE i.tenant_id = v_tenant AND i.principal = p_principal AND i.report_key = p_report_key;
END
$$;
REVOKE ALL ON FUNCTION diagnostics.store_report(
    text, text, bytea, bytea, text, integer, text, text, integer, text, text, boolean, bigint, text, jsonb)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION diagnostics.store_report(
    text, text, bytea, bytea, text, integer, text, text, integer, text, text, boolean, bigint, text, jsonb)
    TO effect_ledger_runtime;
"""

FEED_COLUMN = (
    "ALTER TABLE ledger.operations ADD COLUMN feed_position bigint",
    "ALTER TABLE ledger.operations ADD CONSTRAINT operations_feed_position_check CHECK (feed_position >= 1)",
)

# The feed in position order (replacing the resolution-time order of 0001's operations_receipts),
# and the (small) set of committed rows still waiting for a position. One statement per script: Citus
# forwards index DDL on a distributed table to the workers with the script's text.
FEED_INDEXES = (
    "DROP INDEX ledger.operations_receipts",
    "CREATE UNIQUE INDEX operations_feed ON ledger.operations (tenant_id, feed_position)"
    " WHERE status = 'committed'",
    "CREATE INDEX operations_unpositioned ON ledger.operations (tenant_id, resolved_at, operation_id)"
    " WHERE status = 'committed' AND feed_position IS NULL",
)

FEED = r"""
CREATE TABLE ledger.feed_counters (
    tenant_id     text   NOT NULL,
    last_position bigint NOT NULL CHECK (last_position >= 0),
    PRIMARY KEY (tenant_id)
);
ALTER TABLE ledger.feed_counters ENABLE ROW LEVEL SECURITY;
ALTER TABLE ledger.feed_counters FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON ledger.feed_counters
    USING (tenant_id = current_setting('effect_ledger.tenant', true))
    WITH CHECK (tenant_id = current_setting('effect_ledger.tenant', true));
CREATE POLICY maintenance ON ledger.feed_counters TO CURRENT_USER
    USING (current_setting('effect_ledger.maintenance', true) = 'on');
GRANT SELECT, INSERT, UPDATE ON ledger.feed_counters TO effect_ledger_runtime;
"""

# Backfill: what is committed now gets positions in resolution order, per tenant. Across tenants, so
# with the maintenance switch (0002), set by SET LOCAL alone in its script so that Citus forwards it to
# the workers (0004's pattern). Both statements group by tenant_id, so Citus runs them on every shard.
FEED_BACKFILL = (
    "SET LOCAL effect_ledger.maintenance = 'on'",
    r"""
UPDATE ledger.operations AS o
SET feed_position = n.position
FROM (
    SELECT tenant_id, operation_id,
           row_number() OVER (PARTITION BY tenant_id ORDER BY resolved_at, operation_id) AS position
    FROM ledger.operations
    WHERE status = 'committed'
) AS n
WHERE o.tenant_id = n.tenant_id AND o.operation_id = n.operation_id
""",
    r"""
INSERT INTO ledger.feed_counters (tenant_id, last_position)
SELECT tenant_id, max(feed_position) FROM ledger.operations
WHERE feed_position IS NOT NULL
GROUP BY tenant_id
""",
    "SET LOCAL effect_ledger.maintenance = 'off'",
)

# A tombstone is a terminal row whose receipt body and reason were purged (both NULL): nothing else
# terminal looks so. A new attempt on a purged not_applied ID fills them again when it ends, which
# makes the row purgeable again. purged_seq/purged_hash: the chain point the purge cut at, from
# which the remaining (later) events still verify. Columns, then one constraint change per script.
TOMBSTONE_COLUMNS = (
    r"""
ALTER TABLE ledger.operations
    ADD COLUMN purged_at timestamptz,
    ADD COLUMN purged_seq integer,
    ADD COLUMN purged_hash text,
    ADD COLUMN receipt_digest text
""",
    "ALTER TABLE ledger.operations ADD CONSTRAINT operations_purged_seq_check CHECK (purged_seq >= 0)",
    "ALTER TABLE ledger.operations"
    " ADD CONSTRAINT operations_purged_hash_check CHECK (purged_hash ~ '^[0-9a-f]{64}$')",
    "ALTER TABLE ledger.operations"
    " ADD CONSTRAINT operations_receipt_digest_check CHECK (receipt_digest ~ '^sha256:[0-9a-f]{64}$')",
    "ALTER TABLE ledger.operations"
    " ADD CONSTRAINT operations_purge_point CHECK ((purged_seq IS NULL) = (purged_hash IS NULL))",
    "ALTER TABLE ledger.operations DROP CONSTRAINT operations_check",
    "ALTER TABLE ledger.operations DROP CONSTRAINT operations_check1",
    "ALTER TABLE ledger.operations ADD CONSTRAINT operations_committed_receipt"
    " CHECK (status <> 'committed' OR receipt IS NOT NULL OR receipt_digest IS NOT NULL)",
    "ALTER TABLE ledger.operations ADD CONSTRAINT operations_not_applied_reason"
    " CHECK (status <> 'not_applied' OR not_applied_reason IS NOT NULL OR purged_seq IS NOT NULL)",
)

# Purge walks live terminal rows by age; tombstone expiry walks tombstones by age. Two partial
# indexes, so neither ever scans through the other's rows (400 days of tombstones, say).
TOMBSTONE_INDEXES = (
    "DROP INDEX ledger.operations_terminal_age",
    "CREATE INDEX operations_purgeable ON ledger.operations (updated_at)"
    " WHERE status IN ('committed', 'not_applied')"
    " AND (receipt IS NOT NULL OR not_applied_reason IS NOT NULL)",
    "CREATE INDEX operations_tombstones ON ledger.operations (updated_at)"
    " WHERE status IN ('committed', 'not_applied') AND receipt IS NULL AND not_applied_reason IS NULL",
)

# The write path's functions (0005) judge a repeat with ledger.same_outcome; the domain's rules
# changed in two places (domain/transitions.same_outcome and decide_resolve): a tombstone has no
# receipt or reason left, so only its outcome can agree; and `unresolved` claims no outcome, so on a
# terminal operation it changes nothing. Only ledger.resolve ever passes 'unresolved'.
WRITE_PATH_RULES = r"""
CREATE OR REPLACE FUNCTION ledger.same_outcome(o ledger.operations, outcome text, receipt jsonb, reason jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT outcome = 'unresolved' OR (outcome = o.status AND CASE
        WHEN o.receipt IS NULL AND o.not_applied_reason IS NULL THEN true  -- a tombstone
        WHEN o.status = 'committed' THEN (
            SELECT bool_and(COALESCE(o.receipt -> k, 'null') = COALESCE(receipt -> k, 'null'))
            FROM unnest(ARRAY['external_ref', 'result_digest', 'result', 'observed_at']) AS k)
        ELSE o.not_applied_reason IS NOT DISTINCT FROM reason
    END)
$$;
"""


def upgrade() -> None:
    """Diagnostics report keys, feed positions with their counters, tombstone columns, and the write
    path's same-outcome rule for tombstones and `unresolved`."""
    for script in (*DIAGNOSTICS, STORE_REPORT, *FEED_COLUMN, *FEED_INDEXES, FEED):
        execute_script(script)
    # On Citus the counter lives in the tenant's shard group, so the lock, the stamping and the feed
    # read of one tenant are all single-shard, on one node. Nothing on plain PostgreSQL.
    distribute_by_tenant("ledger.feed_counters")
    for script in (*FEED_BACKFILL, *TOMBSTONE_COLUMNS, *TOMBSTONE_INDEXES, WRITE_PATH_RULES):
        execute_script(script)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
