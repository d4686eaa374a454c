"""breakers: one circuit breaker per external system (`@step(system=...)`)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('breakers',
                    sa.Column('system', sa.String(length=100), nullable=False),
                    sa.Column('failures', sa.Integer(), nullable=False),
                    sa.Column('open_until', sa.DateTime(), nullable=True),
                    sa.Column('updated_at', sa.DateTime(), nullable=False),
                    sa.PrimaryKeyConstraint('system'))


def downgrade() -> None:
    op.drop_table('breakers')
