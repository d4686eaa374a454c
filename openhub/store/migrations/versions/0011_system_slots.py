"""system_slots: the calls in flight a limited external system allows (OPENHUB_SYSTEM_LIMITS)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-23
"""
from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('system_slots',
                    sa.Column('system', sa.String(length=100), nullable=False),
                    sa.Column('slot', sa.Integer(), nullable=False),
                    sa.Column('step_run', sa.String(length=36), nullable=True),
                    sa.Column('held_until', sa.DateTime(), nullable=True),
                    sa.PrimaryKeyConstraint('system', 'slot'))


def downgrade() -> None:
    op.drop_table('system_slots')
