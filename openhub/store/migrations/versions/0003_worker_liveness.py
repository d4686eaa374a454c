"""worker liveness, in-flight runs, entity records that remember their last success, error codes

Revision ID: 0003
Revises: 0001
Create Date: 2026-11-23
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0001'
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('workers',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('node', sa.String(length=255), nullable=False),
    sa.Column('up_since', sa.DateTime(), nullable=False),
    sa.Column('last_seen', sa.DateTime(), nullable=False),
    sa.Column('runs', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('worker', sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column('blocked_since', sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column('error_code', sa.String(length=100), nullable=True))
        batch_op.create_index('ix_messages_error_code', ['error_code', 'received_at'], unique=False,
                              postgresql_where=sa.text('error_code IS NOT NULL'),
                              sqlite_where=sa.text('error_code IS NOT NULL'))
        batch_op.create_index('ix_messages_worker', ['worker'], unique=False,
                              postgresql_where=sa.text('worker IS NOT NULL'), sqlite_where=sa.text('worker IS NOT NULL'))
    with op.batch_alter_table('ext_calls', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ok_message_id', Id, nullable=True))
        batch_op.add_column(sa.Column('ok_msg_timestamp', sa.DateTime(), nullable=True))
    # Records already OK remember their owner as the last success.
    op.execute("UPDATE ext_calls SET ok_message_id = message_id, ok_msg_timestamp = msg_timestamp WHERE state = 'OK'")
    # Entity records and funnels are kept per source system (one system's messages can no longer make
    # another's obsolete or block its ordered funnel): records and funnels already stored move over, so
    # a message mid-retry finds its entity call done and its funnel peers.
    op.execute("UPDATE ext_calls SET key = 'entity:' || (SELECT m.source_system FROM messages m "
               "WHERE m.id = ext_calls.message_id) || ':' || substr(key, 8) WHERE key LIKE 'entity:%'")
    op.execute("UPDATE messages SET funnel = source_system || ':' || funnel WHERE funnel IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table('ext_calls', schema=None) as batch_op:
        batch_op.drop_column('ok_msg_timestamp')
        batch_op.drop_column('ok_message_id')
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.drop_index('ix_messages_worker')
        batch_op.drop_index('ix_messages_error_code')
        batch_op.drop_column('error_code')
        batch_op.drop_column('blocked_since')
        batch_op.drop_column('worker')
    op.drop_table('workers')
