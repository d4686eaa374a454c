"""waits: each ask of a waiting step, its token and the answer bound to it (answers by token, issue 33)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('waits',
                    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True,
                              nullable=False),
                    sa.Column('token', sa.String(length=36), nullable=False),
                    sa.Column('message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
                    sa.Column('step_key', sa.String(length=100), nullable=True),
                    sa.Column('asked_at', sa.DateTime(), nullable=True),
                    sa.Column('answer', sa.Text(), nullable=True),
                    sa.Column('answered_at', sa.DateTime(), nullable=True),
                    sa.Column('answered_by', sa.String(length=100), nullable=True),
                    sa.ForeignKeyConstraint(['message_id'], ['messages.id']),
                    sa.PrimaryKeyConstraint('id'),
                    sa.UniqueConstraint('token'))
    op.create_index('ix_waits_message', 'waits', ['message_id'])


def downgrade() -> None:
    op.drop_index('ix_waits_message', table_name='waits')
    op.drop_table('waits')
