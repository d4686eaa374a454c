"""worker_holds, workers.parent, workers.taking, route_pauses.intake_only: an operator's "finish what you have,
take nothing new" for a worker or a host, what each worker's main process says it does, and a drain that
refuses new messages only (issue 36, worker states and the drain split)

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""
from alembic import op
import sqlalchemy as sa


revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'worker_holds',
        sa.Column('target', sa.String(length=300), primary_key=True),
        sa.Column('since', sa.DateTime(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('by', sa.String(length=100), nullable=True),
    )
    with op.batch_alter_table('workers') as batch:
        batch.add_column(sa.Column('parent', sa.String(length=255), nullable=True))
        batch.add_column(sa.Column('taking', sa.Boolean(), nullable=True))
    with op.batch_alter_table('route_pauses') as batch:
        batch.add_column(sa.Column('intake_only', sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('route_pauses') as batch:
        batch.drop_column('intake_only')
    with op.batch_alter_table('workers') as batch:
        batch.drop_column('taking')
        batch.drop_column('parent')
    op.drop_table('worker_holds')
