"""Maintenance access for the owner: sweep and purge see every tenant, and only when they say so.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from effect_ledger.db.migrate import execute_script

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

MAINTENANCE = r"""
-- Forced row-level security binds the table owner too, unless it is a superuser or has BYPASSRLS,
-- which managed PostgreSQL services (and CloudNativePG with superuser access off) do not give.
-- The sweeper and the purge run as the owner across tenants. This permissive policy, OR-ed with
-- tenant_isolation, lets exactly the login that ran this migration (the owner) see every row, and
-- only inside a transaction that has set effect_ledger.maintenance = 'on'. The runtime and reader
-- roles are not named, so nothing changes for them: they can set the variable, and it does nothing.
CREATE POLICY maintenance ON ledger.operations TO CURRENT_USER
    USING (current_setting('effect_ledger.maintenance', true) = 'on');
CREATE POLICY maintenance ON ledger.events TO CURRENT_USER
    USING (current_setting('effect_ledger.maintenance', true) = 'on');
-- The same for the diagnostics tables, whose retention the purge also enforces.
CREATE POLICY maintenance ON diagnostics.incidents TO CURRENT_USER
    USING (current_setting('effect_ledger.maintenance', true) = 'on');
CREATE POLICY maintenance ON diagnostics.access_log TO CURRENT_USER
    USING (current_setting('effect_ledger.maintenance', true) = 'on');
"""


def upgrade() -> None:
    """Add the owner's opt-in maintenance policy to every tenant-keyed table."""
    execute_script(MAINTENANCE)


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
