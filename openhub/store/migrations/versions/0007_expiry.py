"""messages.expires_at: a message not started by then ends FAILED with error code EXPIRED

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('messages', sa.Column('expires_at', sa.DateTime(), nullable=True))


def downgrade() -> None:
    op.drop_column('messages', 'expires_at')
