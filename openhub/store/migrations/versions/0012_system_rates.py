"""system_rates: the token bucket of a rate-limited external system (OPENHUB_SYSTEM_RATES)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-23
"""
from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('system_rates',
                    sa.Column('system', sa.String(length=100), nullable=False),
                    sa.Column('tokens', sa.Float(), nullable=False),
                    sa.Column('updated_at', sa.DateTime(), nullable=False),
                    sa.PrimaryKeyConstraint('system'))


def downgrade() -> None:
    op.drop_table('system_rates')
