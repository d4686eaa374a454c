"""ext_calls.worker: the process (host:pid) that made a step's last attempt

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23
"""
from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('ext_calls', sa.Column('worker', sa.String(length=255), nullable=True))


def downgrade() -> None:
    op.drop_column('ext_calls', 'worker')
