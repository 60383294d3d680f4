"""initial schema: endpoints, outbox (claim queue), delivery attempts, claim-token sequence

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 10:43:48.045690
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence("poller_claim_token_seq", start=1)))
    op.create_table('poller_endpoints',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('secret', sa.Text(), nullable=False),
    sa.Column('previous_secret', sa.Text(), nullable=True),
    sa.Column('previous_secret_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('lookup_url', sa.Text(), nullable=True),
    sa.Column('enabled', sa.Boolean(), server_default=sa.text('true'), nullable=False),
    sa.Column('disabled_reason', sa.Text(), nullable=True),
    sa.Column('max_attempts', sa.Integer(), nullable=True),
    sa.Column('timeout', sa.Float(), nullable=True),
    sa.Column('max_in_flight', sa.Integer(), nullable=True),
    sa.Column('bucket', sa.SmallInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('bucket >= 0 AND bucket < 256', name=op.f('ck_poller_endpoints_bucket_range')),
    sa.CheckConstraint('max_attempts IS NULL OR max_attempts >= 1', name=op.f('ck_poller_endpoints_max_attempts_positive')),
    sa.CheckConstraint('max_in_flight IS NULL OR max_in_flight >= 1', name=op.f('ck_poller_endpoints_max_in_flight_positive')),
    sa.CheckConstraint('timeout IS NULL OR timeout > 0', name=op.f('ck_poller_endpoints_timeout_positive')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_poller_endpoints')),
    sa.UniqueConstraint('name', name=op.f('uq_poller_endpoints_name'))
    )
    op.create_table('poller_outbox',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('endpoint_id', sa.BigInteger(), nullable=False),
    sa.Column('bucket', sa.SmallInteger(), nullable=False),
    sa.Column('event_type', sa.Text(), nullable=False),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('idempotency_key', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), server_default=sa.text("'pending'"), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('claim_token', sa.BigInteger(), nullable=True),
    sa.Column('claimed_by', sa.Text(), nullable=True),
    sa.Column('claim_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('needs_lookup', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('last_status_code', sa.Integer(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('failed_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status <> 'in_flight' OR (claim_token IS NOT NULL AND claim_expires_at IS NOT NULL)", name=op.f('ck_poller_outbox_in_flight_is_claimed')),
    sa.CheckConstraint("status IN ('pending', 'in_flight', 'delivered', 'failed')", name=op.f('ck_poller_outbox_status_valid')),
    sa.CheckConstraint('attempts >= 0', name=op.f('ck_poller_outbox_attempts_not_negative')),
    sa.CheckConstraint('max_attempts >= 1', name=op.f('ck_poller_outbox_max_attempts_positive')),
    sa.ForeignKeyConstraint(['endpoint_id'], ['poller_endpoints.id'], name=op.f('fk_poller_outbox_endpoint_id_poller_endpoints'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_poller_outbox')),
    sa.UniqueConstraint('endpoint_id', 'idempotency_key', name='uq_poller_outbox_endpoint_key')
    )
    op.create_index('ix_poller_outbox_claim', 'poller_outbox', ['next_attempt_at', 'id'], unique=False, postgresql_where=sa.text("status = 'pending'"))
    op.create_index('ix_poller_outbox_delivered', 'poller_outbox', ['delivered_at'], unique=False, postgresql_where=sa.text("status = 'delivered'"))
    op.create_index('ix_poller_outbox_failed', 'poller_outbox', ['failed_at'], unique=False, postgresql_where=sa.text("status = 'failed'"))
    op.create_index('ix_poller_outbox_reclaim', 'poller_outbox', ['claim_expires_at'], unique=False, postgresql_where=sa.text("status = 'in_flight'"))
    op.create_table('poller_delivery_attempts',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('message_id', sa.BigInteger(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('claim_token', sa.BigInteger(), nullable=True),
    sa.Column('poller_id', sa.Text(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('duration_ms', sa.Float(), nullable=True),
    sa.Column('outcome', sa.Text(), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('error_class', sa.Text(), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('response_excerpt', sa.Text(), nullable=True),
    sa.Column('stale', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.CheckConstraint("kind IN ('send', 'lookup', 'manual')", name=op.f('ck_poller_delivery_attempts_kind_valid')),
    sa.ForeignKeyConstraint(['message_id'], ['poller_outbox.id'], name=op.f('fk_poller_delivery_attempts_message_id_poller_outbox'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_poller_delivery_attempts'))
    )
    op.create_index('ix_poller_delivery_attempts_message', 'poller_delivery_attempts', ['message_id', 'id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_poller_delivery_attempts_message', table_name='poller_delivery_attempts')
    op.drop_table('poller_delivery_attempts')
    op.drop_index('ix_poller_outbox_reclaim', table_name='poller_outbox', postgresql_where=sa.text("status = 'in_flight'"))
    op.drop_index('ix_poller_outbox_failed', table_name='poller_outbox', postgresql_where=sa.text("status = 'failed'"))
    op.drop_index('ix_poller_outbox_delivered', table_name='poller_outbox', postgresql_where=sa.text("status = 'delivered'"))
    op.drop_index('ix_poller_outbox_claim', table_name='poller_outbox', postgresql_where=sa.text("status = 'pending'"))
    op.drop_table('poller_outbox')
    op.drop_table('poller_endpoints')
    op.execute(sa.schema.DropSequence(sa.Sequence("poller_claim_token_seq")))
