"""indexes for the overview: live rows by route, and messages.finished_at

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23

Partial (finished rows only): the overview reads the last hour and day of finished messages, and
without an index that is a scan of every message kept. On PostgreSQL it includes the columns the
overview groups by (state, service, operation), so its counts are index-only scans.
`ix_messages_live` holds only rows not in a final state, by route: the per-route counts and oldest
live message read it alone, so their cost follows the backlog, not the table.
"""
from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


LIVE = "state NOT IN ('CANCEL', 'FAILED', 'OK', 'SKIPPED')"


def upgrade() -> None:
    op.create_index('ix_messages_live', 'messages', ['state', 'service', 'operation', 'received_at'], unique=False,
                    postgresql_where=sa.text(LIVE), sqlite_where=sa.text(LIVE))
    op.create_index('ix_messages_finished', 'messages', ['finished_at'], unique=False,
                    postgresql_where=sa.text('finished_at IS NOT NULL'),
                    sqlite_where=sa.text('finished_at IS NOT NULL'),
                    postgresql_include=['state', 'service', 'operation'])


def downgrade() -> None:
    op.drop_index('ix_messages_live', table_name='messages')
    op.drop_index('ix_messages_finished', table_name='messages')
