"""Citus: distribute every table by tenant_id, co-located, when the citus extension is installed.

On plain PostgreSQL this migration does nothing. On a Citus coordinator it distributes
ledger.operations by tenant_id and co-locates ledger.events, diagnostics.incidents and
diagnostics.access_log with it: all rows of a tenant live in one shard group, so a claim, a
transition and its event append stay single-shard transactions. Tables are distributed while
empty (this runs right after the schema is created), parents before children.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from effect_ledger.db.migrate import execute_script

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

DISTRIBUTE = r"""
DO $$
DECLARE
    -- parents first: a foreign key between distributed tables needs its target distributed already
    tables constant text[] := ARRAY[
        'ledger.operations', 'ledger.events', 'diagnostics.incidents', 'diagnostics.access_log'];
    relation text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;  -- plain PostgreSQL: one database holds everything
    END IF;
    -- Several distributed tables with foreign keys in one transaction: Citus needs one connection
    -- per node for that. The append-only triggers on events are plain triggers that only raise;
    -- Citus copies them to every shard once unsafe triggers are allowed for this step.
    PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    PERFORM set_config('citus.enable_unsafe_triggers', 'on', true);
    FOREACH relation IN ARRAY tables LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = relation::regclass);
        IF relation = 'ledger.operations' THEN
            PERFORM create_distributed_table(relation::regclass, 'tenant_id');
        ELSE
            PERFORM create_distributed_table(
                relation::regclass, 'tenant_id', colocate_with => 'ledger.operations');
        END IF;
    END LOOP;
    -- Row-level security runs on the workers' shards, which see a setting only if the coordinator
    -- forwards it; Citus forwards SET LOCAL (not set_config) when this is 'local'. See README, Citus.
    ALTER ROLE effect_ledger_runtime SET citus.propagate_set_commands = 'local';
    ALTER ROLE effect_ledger_diag_reader SET citus.propagate_set_commands = 'local';
    ALTER ROLE CURRENT_USER SET citus.propagate_set_commands = 'local';
END
$$;
"""


def upgrade() -> None:
    """Distribute and co-locate the tables by tenant_id on Citus; nothing on plain PostgreSQL."""
    execute_script(DISTRIBUTE)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
