"""split children's correlation ids in their own namespace, per parent

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # SQLite keeps the old unique constraint inside CREATE TABLE: the table is rebuilt (env.py turns
    # foreign keys off around it and checks them all after).
    with op.batch_alter_table('messages', schema=None, recreate='auto') as batch_op:
        batch_op.drop_constraint('uq_messages_source_correlation', type_='unique')
        batch_op.alter_column('correlation_id', existing_type=sa.String(length=255), type_=sa.String(length=320),
                              existing_nullable=False)
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.create_index('uq_messages_source_correlation', ['source_system', 'correlation_id'], unique=True,
                              postgresql_where=sa.text('parent_id IS NULL'), sqlite_where=sa.text('parent_id IS NULL'))
        batch_op.create_index('uq_messages_child', ['parent_id', 'correlation_id'], unique=True,
                              postgresql_where=sa.text('parent_id IS NOT NULL'),
                              sqlite_where=sa.text('parent_id IS NOT NULL'))


def downgrade() -> None:
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.drop_index('uq_messages_child')
        batch_op.drop_index('uq_messages_source_correlation')
    with op.batch_alter_table('messages', schema=None, recreate='auto') as batch_op:
        batch_op.alter_column('correlation_id', existing_type=sa.String(length=320), type_=sa.String(length=255),
                              existing_nullable=False)
        batch_op.create_unique_constraint('uq_messages_source_correlation', ['source_system', 'correlation_id'])
