"""messages.priority: 0-9, higher = sooner (the message's own, else its route's, else OPENHUB_DEFAULT_PRIORITY)

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa


revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Messages stored before have the default priority (4, JMS's).
    with op.batch_alter_table('messages') as batch:
        batch.add_column(sa.Column('priority', sa.SmallInteger(), nullable=False, server_default='4'))


def downgrade() -> None:
    with op.batch_alter_table('messages') as batch:
        batch.drop_column('priority')
