"""http_exchanges: requests and responses recorded by HTTP steps

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

(0002, the workers heartbeat table, is slotted in between when both branches are merged.)
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('http_exchanges',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('step_key', sa.String(length=100), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('method', sa.String(length=10), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('status', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('request_headers', sa.Text(), nullable=True),
    sa.Column('request_body', sa.Text(), nullable=True),
    sa.Column('response_headers', sa.Text(), nullable=True),
    sa.Column('response_body', sa.Text(), nullable=True),
    sa.Column('duration_ms', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['message_id'], ['messages.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_http_exchanges_message', 'http_exchanges', ['message_id'], unique=False)
    op.create_index('ix_http_exchanges_at', 'http_exchanges', ['at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_http_exchanges_at', table_name='http_exchanges')
    op.drop_index('ix_http_exchanges_message', table_name='http_exchanges')
    op.drop_table('http_exchanges')
