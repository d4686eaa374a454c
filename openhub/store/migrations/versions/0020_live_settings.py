"""live_settings, settings_snapshots: settings an admin changes at run time, and the settings in force in the
newest process of each kind (issue 36, live configuration)

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27
"""
from alembic import op
import sqlalchemy as sa


revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'live_settings',
        sa.Column('name', sa.String(length=100), primary_key=True),
        sa.Column('value', sa.Text(), nullable=False),
        sa.Column('set_at', sa.DateTime(), nullable=False),
        sa.Column('set_by', sa.String(length=100), nullable=True),
        sa.Column('reason', sa.Text(), nullable=True),
    )
    op.create_table(
        'settings_snapshots',
        sa.Column('kind', sa.String(length=20), primary_key=True),
        sa.Column('node', sa.String(length=255), nullable=False),
        sa.Column('settings', sa.Text(), nullable=False),
        sa.Column('seen_at', sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('settings_snapshots')
    op.drop_table('live_settings')
