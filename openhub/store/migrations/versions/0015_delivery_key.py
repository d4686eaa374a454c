"""confirmations.delivery_key: a notification's random id for its receiver (the webhook-id), the same on every retry

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('confirmations') as batch:
        batch.add_column(sa.Column('delivery_key', sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('confirmations') as batch:
        batch.drop_column('delivery_key')
