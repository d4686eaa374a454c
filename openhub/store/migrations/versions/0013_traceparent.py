"""messages.traceparent: the W3C trace context each span of a message's life continues (openhub.core.tracing)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25
"""
from alembic import op
import sqlalchemy as sa


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('messages') as batch:
        batch.add_column(sa.Column('traceparent', sa.String(length=55), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('messages') as batch:
        batch.drop_column('traceparent')
