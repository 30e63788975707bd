"""The receipts log's tiles and entry bundles stored without compression (issue 22, round 14).

Every integration pass writes the tenant's rightmost entry bundle again as it grows (up to 256 entries
of ~530 bytes of leaf JSON: ~130 kB), and PostgreSQL compressed each write with pglz before TOASTing it:
`log_tile_put` cost 14.8-14.9 µs of PostgreSQL execution per effect cycle (pg_stat_statements, track
= all, full cycles at ~900 a second; docs/performance.md, round 14). With `STORAGE EXTERNAL` (out of
line, never compressed): 2.6-2.9 µs, for ~350 more WAL bytes a cycle (5,580 -> 5,935) and entry
bundles ~1.9x larger on disk (~530 against ~280 bytes an entry). Tile hashes (level 0 and up) do not
compress at all; they are inline-sized rows, unaffected. Rows written before keep their compressed form
until they are written again (only the rightmost tile and bundle ever are); readers see the same bytes.

On Citus the column keeps the default (pglz): Citus refuses `ALTER COLUMN ... SET STORAGE` on a
distributed table, and setting it shard by shard would not reach shards created later (a rebalance, a
new worker), so the shards would disagree.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03
"""

from effect_ledger.db.migrate import execute_script, on_citus

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """log_tiles.data out of line and uncompressed, on plain PostgreSQL (see above for Citus)."""
    if not on_citus():
        execute_script("ALTER TABLE ledger.log_tiles ALTER COLUMN data SET STORAGE EXTERNAL")


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
