"""The verifiable receipts log (issue 22, API.md section 14): a per-tenant RFC 6962 tree of committed
receipts in feed order, kept as c2sp.org/tlog-tiles tiles and entry bundles, with its signed checkpoints.

- `ledger.log_state`: one row per tenant, the integrated tree (size, root). The integrator locks it
  (FOR UPDATE SKIP LOCKED): one writer per tenant, never waited for.
- `ledger.log_tiles`: (tenant, level, index) -> the tile's hashes; level -1 holds the entry bundles.
  Only the rightmost tile of each level grows; a full tile (256 hashes) is never written again.
- `ledger.log_checkpoints`: every checkpoint the signer signed, with the witness cosignatures got for it.
- `ledger.log_decisions`: an operator's recorded acceptance of a loss (log-recover --accept-loss).

No signing key and no signer state are here: the signer keeps both outside the database.
Every primary key starts with tenant_id; on Citus the tables are co-located with ledger.operations.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from effect_ledger.db.migrate import distribute_by_tenant, execute_script, isolate_by_tenant

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

TABLES = r"""
CREATE TABLE ledger.log_state (
    tenant_id     text        NOT NULL,
    size          bigint      NOT NULL CHECK (size >= 0),
    root          bytea       NOT NULL CHECK (octet_length(root) = 32),
    integrated_at timestamptz NOT NULL,
    signed_size   bigint,       -- the latest checkpoint's size and time (also in log_checkpoints)
    signed_at     timestamptz,
    PRIMARY KEY (tenant_id)
);
CREATE TABLE ledger.log_tiles (
    tenant_id text     NOT NULL,
    level     smallint NOT NULL CHECK (level BETWEEN -1 AND 63),
    idx       bigint   NOT NULL CHECK (idx >= 0),
    width     smallint NOT NULL CHECK (width BETWEEN 1 AND 256),
    data      bytea    NOT NULL,
    PRIMARY KEY (tenant_id, level, idx)
);
CREATE TABLE ledger.log_checkpoints (
    tenant_id    text        NOT NULL,
    size         bigint      NOT NULL CHECK (size >= 0),
    root         bytea       NOT NULL CHECK (octet_length(root) = 32),
    note         text        NOT NULL,
    cosignatures text        NOT NULL DEFAULT '',
    signed_at    timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, size)
);
CREATE TABLE ledger.log_decisions (
    tenant_id   text        NOT NULL,
    decided_at  timestamptz NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('accept_loss', 'recovered')),
    signed_size bigint      NOT NULL,
    db_size     bigint      NOT NULL,
    reason      text        NOT NULL,
    PRIMARY KEY (tenant_id, decided_at)
);
"""

LOGS = ("ledger.log_state", "ledger.log_tiles", "ledger.log_checkpoints", "ledger.log_decisions")


def upgrade() -> None:
    """The log's tables, tenant-isolated, readable by the runtime role, distributed by tenant on Citus."""
    execute_script(TABLES)
    isolate_by_tenant(*LOGS)
    # the service's runtime role only reads the log (the integrator writes as the owner)
    execute_script(f"GRANT SELECT ON {', '.join(LOGS)} TO effect_ledger_runtime")
    distribute_by_tenant(*LOGS)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
