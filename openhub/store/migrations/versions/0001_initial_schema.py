"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-21
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('messages',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('source_system', sa.String(length=100), nullable=False),
    sa.Column('correlation_id', sa.String(length=255), nullable=False),
    sa.Column('process_id', sa.String(length=255), nullable=True),
    sa.Column('service', sa.String(length=100), nullable=False),
    sa.Column('operation', sa.String(length=100), nullable=False),
    sa.Column('object_id', sa.String(length=255), nullable=True),
    sa.Column('entity_type', sa.String(length=100), nullable=True),
    sa.Column('funnel', sa.String(length=255), nullable=True),
    sa.Column('parent_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('payload', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('failed_count', sa.Integer(), nullable=False),
    sa.Column('attempt_id', sa.String(length=36), nullable=True),
    sa.Column('step_run', sa.String(length=36), nullable=True),
    sa.Column('due_at', sa.DateTime(), nullable=True),
    sa.Column('received_at', sa.DateTime(), nullable=False),
    sa.Column('msg_timestamp', sa.DateTime(), nullable=False),
    sa.Column('started_at', sa.DateTime(), nullable=True),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.Column('finished_at', sa.DateTime(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('generation', sa.Integer(), nullable=False),
    sa.Column('custom_data', sa.Text(), nullable=True),
    sa.Column('business_errors', sa.Text(), nullable=True),
    sa.Column('response', sa.Text(), nullable=True),
    sa.Column('failed_step', sa.String(length=100), nullable=True),
    sa.Column('failed_error', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['parent_id'], ['messages.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('source_system', 'correlation_id', name='uq_messages_source_correlation')
    )
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.create_index('ix_messages_due', ['due_at'], unique=False, postgresql_where=sa.text('due_at IS NOT NULL'), sqlite_where=sa.text('due_at IS NOT NULL'))
        batch_op.create_index('ix_messages_entity', ['entity_type', 'object_id'], unique=False)
        batch_op.create_index('ix_messages_funnel', ['funnel', 'state', 'msg_timestamp'], unique=False, postgresql_where=sa.text('funnel IS NOT NULL'), sqlite_where=sa.text('funnel IS NOT NULL'))
        batch_op.create_index('ix_messages_parent', ['parent_id'], unique=False)
        batch_op.create_index('ix_messages_received', ['received_at'], unique=False)
        batch_op.create_index('ix_messages_route', ['service', 'operation', 'received_at'], unique=False)
        batch_op.create_index('ix_messages_state_received', ['state', 'received_at'], unique=False)

    op.create_table('route_pauses',
    sa.Column('route', sa.String(length=201), nullable=False),
    sa.Column('paused_at', sa.DateTime(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('route')
    )
    op.create_table('confirmations',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('outcome', sa.String(length=20), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('claim', sa.String(length=36), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('due_at', sa.DateTime(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['message_id'], ['messages.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('confirmations', schema=None) as batch_op:
        batch_op.create_index('ix_confirmations_due', ['due_at'], unique=False, postgresql_where=sa.text('due_at IS NOT NULL'), sqlite_where=sa.text('due_at IS NOT NULL'))
        batch_op.create_index('ix_confirmations_message', ['message_id'], unique=False)
        batch_op.create_index('ix_confirmations_state', ['state'], unique=False)

    op.create_table('ext_calls',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('key', sa.String(length=600), nullable=False),
    sa.Column('message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('step_key', sa.String(length=100), nullable=False),
    sa.Column('scope', sa.String(length=10), nullable=False),
    sa.Column('state', sa.String(length=10), nullable=False),
    sa.Column('msg_timestamp', sa.DateTime(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.Column('duration_ms', sa.Integer(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['message_id'], ['messages.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key')
    )
    with op.batch_alter_table('ext_calls', schema=None) as batch_op:
        batch_op.create_index('ix_ext_calls_message', ['message_id'], unique=False)
        batch_op.create_index('ix_ext_calls_updated', ['updated_at'], unique=False)

    op.create_table('transitions',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('at', sa.DateTime(), nullable=False),
    sa.Column('event', sa.String(length=30), nullable=False),
    sa.Column('from_state', sa.String(length=20), nullable=True),
    sa.Column('to_state', sa.String(length=20), nullable=False),
    sa.Column('step_key', sa.String(length=100), nullable=True),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['message_id'], ['messages.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('transitions', schema=None) as batch_op:
        batch_op.create_index('ix_transitions_message', ['message_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('transitions', schema=None) as batch_op:
        batch_op.drop_index('ix_transitions_message')

    op.drop_table('transitions')
    with op.batch_alter_table('ext_calls', schema=None) as batch_op:
        batch_op.drop_index('ix_ext_calls_updated')
        batch_op.drop_index('ix_ext_calls_message')

    op.drop_table('ext_calls')
    with op.batch_alter_table('confirmations', schema=None) as batch_op:
        batch_op.drop_index('ix_confirmations_state')
        batch_op.drop_index('ix_confirmations_message')
        batch_op.drop_index('ix_confirmations_due', postgresql_where=sa.text('due_at IS NOT NULL'), sqlite_where=sa.text('due_at IS NOT NULL'))

    op.drop_table('confirmations')
    op.drop_table('route_pauses')
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.drop_index('ix_messages_state_received')
        batch_op.drop_index('ix_messages_route')
        batch_op.drop_index('ix_messages_received')
        batch_op.drop_index('ix_messages_parent')
        batch_op.drop_index('ix_messages_funnel', postgresql_where=sa.text('funnel IS NOT NULL'), sqlite_where=sa.text('funnel IS NOT NULL'))
        batch_op.drop_index('ix_messages_entity')
        batch_op.drop_index('ix_messages_due', postgresql_where=sa.text('due_at IS NOT NULL'), sqlite_where=sa.text('due_at IS NOT NULL'))

    op.drop_table('messages')
