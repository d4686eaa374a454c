"""confirmations.hook: a state hook's notification (None: the confirmation to the source system)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""
from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('confirmations', sa.Column('hook', sa.String(length=300), nullable=True))


def downgrade() -> None:
    op.drop_column('confirmations', 'hook')
