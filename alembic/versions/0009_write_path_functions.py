"""The write path close to the machine: cheap checks, a feed index that spares complete, and each
write-path function's one current definition in alembic/functions/ (issue 20).

Checks: a bounded repetition in a PostgreSQL regular expression (`{1,200}`, `{64}`) compiles to that
many copies of its state, and matching it costs ~35-120 µs. Every INSERT and UPDATE evaluates every
CHECK of the table, so seven of them cost more per cycle than the rest of PostgreSQL's work together
(docs/performance.md, "Where PostgreSQL's time goes"). Each is replaced by a length test and a
negated character class, which accept exactly the same strings at ~1 µs.

Feed: operations_feed (unique per tenant and position) now covers positioned committed rows only:
a complete inserts no entry with a NULL position into it any more (its position comes later, from the
feed's sequencer). The feed's reads name `status = 'committed' AND feed_position > $n`, which implies
the new predicate.

Functions: alembic/functions/*.sql hold each write-path function's current definition with its
comments; this migration applies them (effect_ledger.db.migrate.apply_functions) and drops the
helpers of 0005/0007/0008 that the new bodies no longer call. A later migration that changes one of
them edits its file and calls apply_functions() again (the files are plpgsql and SQL-language
helpers over the columns of 0009, so an earlier migration applying a newer text still succeeds).
Signatures are unchanged, so 0008's Citus distribution of the functions stays, except ledger.claim's,
which gained approval_policy in 0011 (that migration distributes it).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from effect_ledger.db.migrate import apply_functions, execute_script

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# The value checks become domains: a domain's check runs when a value is assigned to the column (every
# INSERT, and an UPDATE only for the columns it sets), from the type cache; a table CHECK is parsed
# from its stored text (stringToNode) and planned again by every INSERT and UPDATE statement, for every
# check, whichever columns changed: ~1.8 M instructions per cycle, 29 % of PostgreSQL's work in it.
DOMAINS = (
    "CREATE DOMAIN ledger.operation_id AS text"
    " CHECK (length(VALUE) >= 1 AND length(VALUE) <= 200 AND VALUE !~ '[^A-Za-z0-9._:~-]')",
    "CREATE DOMAIN ledger.sha256_digest AS text"
    " CHECK (length(VALUE) = 71 AND left(VALUE, 7) = 'sha256:' AND substr(VALUE, 8) !~ '[^0-9a-f]')",
    "CREATE DOMAIN ledger.hex64 AS text CHECK (length(VALUE) = 64 AND VALUE !~ '[^0-9a-f]')",
)
# (table, the check it replaces, column, domain): same accepted strings, no bounded repetition.
COLUMNS = (
    ("ledger.operations", "operations_operation_id_check", "operation_id", "ledger.operation_id"),
    ("ledger.operations", "operations_intent_digest_check", "intent_digest", "ledger.sha256_digest"),
    ("ledger.operations", "operations_receipt_digest_check", "receipt_digest", "ledger.sha256_digest"),
    ("ledger.operations", "operations_chain_hash_check", "chain_hash", "ledger.hex64"),
    ("ledger.operations", "operations_purged_hash_check", "purged_hash", "ledger.hex64"),
    ("ledger.events", "events_prev_hash_check", "prev_hash", "ledger.hex64"),
    ("ledger.events", "events_hash_check", "hash", "ledger.hex64"),
)

# One statement per script: Citus forwards constraint and index DDL to the workers as written.
FEED_INDEX = (
    "DROP INDEX ledger.operations_feed",
    "CREATE UNIQUE INDEX operations_feed ON ledger.operations (tenant_id, feed_position)"
    " WHERE status = 'committed' AND feed_position IS NOT NULL",
)

# 10_claim.sql is the current claim: since 0011 it takes approval_policy, so 0005's signature goes
# (0011 distributes the new one on Citus).
OLD_CLAIM = "DROP FUNCTION ledger.claim(text, text, text, text, text, text, integer, bytea, bytea, bytea, boolean, text)"
OBSOLETE = r"""
DROP PROCEDURE ledger.chain_event(ledger.operations, jsonb, timestamptz, text, text, text, text, text);
DROP PROCEDURE ledger.submit_state(ledger.operations, jsonb, timestamptz, text, integer);
DROP PROCEDURE ledger.expire_if_due(ledger.operations, jsonb, timestamptz);
DROP PROCEDURE ledger.fresh_attempt(ledger.operations, timestamptz, integer, bytea, bytea, bytea);
DROP PROCEDURE ledger.record_discrepancy(ledger.operations, jsonb, timestamptz, text, text, text, text, text);
DROP PROCEDURE ledger.settle(ledger.operations, jsonb, timestamptz, text, text, text, text, text, text, text);
DROP FUNCTION ledger.claim_verdict(ledger.operations, text, text, text, text, bytea, timestamptz);
DROP FUNCTION ledger.lock_operation(text, text);
DROP FUNCTION ledger.refuse_unusable(ledger.operations, bytea, timestamptz, text[]);
DROP FUNCTION ledger.write_change(ledger.operations, jsonb);
DROP FUNCTION ledger.append_events(ledger.operations, jsonb);
DROP FUNCTION ledger.effective_status(ledger.operations, timestamptz);
"""


def upgrade() -> None:
    """Value checks as domains, the positioned-only feed index, the write path's functions from their files."""
    for script in DOMAINS:
        execute_script(script)
    for table, check, column, domain in COLUMNS:
        execute_script(f"ALTER TABLE {table} DROP CONSTRAINT {check}")
        execute_script(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {domain}")
    for script in FEED_INDEX:
        execute_script(script)
    execute_script(OLD_CLAIM)
    apply_functions()
    execute_script(OBSOLETE)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
