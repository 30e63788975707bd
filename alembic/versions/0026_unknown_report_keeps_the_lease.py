"""complete(unknown) with diagnostics on an operation already unknown keeps its lease (API.md section 2).

"A `submitted` operation whose lease has expired **is** `unknown`: every read reports it so
(`"status": "unknown"`, `"lease_expired": true`)." A report of unknown without diagnostics on such an
operation left its lease as it was; the same report with the attempt's first diagnostics (recorded as a
`completed` event since migration 0024) went through the settlement, which clears the lease, and the
operation then read `"lease_expired": false` and `"lease_expires_at": null`. `ledger.complete` now keeps
the lease when unknown is reported on a row already unknown, with or without diagnostics.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07
"""

from effect_ledger.db.migrate import apply_functions

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """The write path's functions again (ledger.complete)."""
    apply_functions()


def downgrade() -> None:
    """Migrations are forward-only."""
    raise NotImplementedError("effect-ledger migrations are forward-only")
