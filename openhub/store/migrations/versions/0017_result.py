"""messages.result: a synchronous route's result (its last step's return value, JSON), answered to its caller

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa


revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('messages') as batch:
        batch.add_column(sa.Column('result', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('messages') as batch:
        batch.drop_column('result')
