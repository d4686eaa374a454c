"""operator_tokens, audit, audit_messages, breakers.reason: named operator tokens with a role, the audit trail, and
why an operator forced a breaker open (issue 36)

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""
from alembic import op
import sqlalchemy as sa


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        'operator_tokens',
        sa.Column('name', sa.String(length=100), primary_key=True),
        sa.Column('role', sa.String(length=20), nullable=False),
        sa.Column('digest', sa.String(length=64), nullable=False, unique=True),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('created_by', sa.String(length=100), nullable=True),
        sa.Column('revoked_at', sa.DateTime(), nullable=True),
    )
    op.create_table(
        'audit',
        sa.Column('id', Id, primary_key=True, autoincrement=True),
        sa.Column('at', sa.DateTime(), nullable=False),
        sa.Column('who', sa.String(length=100), nullable=False),
        sa.Column('role', sa.String(length=20), nullable=False),
        sa.Column('action', sa.String(length=50), nullable=False),
        sa.Column('target', sa.Text(), nullable=True),
        sa.Column('message_ids', sa.Text(), nullable=True),
        sa.Column('old_value', sa.Text(), nullable=True),
        sa.Column('new_value', sa.Text(), nullable=True),
        sa.Column('client', sa.String(length=100), nullable=True),
        sa.Column('request_id', sa.String(length=100), nullable=True),
    )
    op.create_index('ix_audit_at', 'audit', ['at'])
    op.create_index('ix_audit_who', 'audit', ['who', 'at'])
    op.create_index('ix_audit_action', 'audit', ['action', 'at'])
    op.create_table(
        'audit_messages',
        sa.Column('audit_id', Id, sa.ForeignKey('audit.id'), primary_key=True),
        sa.Column('message_id', Id, primary_key=True),
    )
    op.create_index('ix_audit_messages_message', 'audit_messages', ['message_id'])
    with op.batch_alter_table('breakers') as batch:
        batch.add_column(sa.Column('reason', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('breakers') as batch:
        batch.drop_column('reason')
    op.drop_table('audit_messages')
    op.drop_table('audit')
    op.drop_table('operator_tokens')
