"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from effect_ledger.db.migrate import execute_script

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade() -> None:
    execute_script("""
    """)


def downgrade() -> None:
    raise NotImplementedError("effect-ledger migrations are forward-only")
