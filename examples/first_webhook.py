"""Your first webhook: a business row and its webhook committed in one transaction.

    eval "$(poller embedded start)"     # or: export POLLER_DATABASE_URL=postgresql://…
    poller db upgrade
    python examples/first_webhook.py

The shop's own table (``invoices``) and the poller's tables live in one
database, so one transaction covers both: the invoice and its webhook exist
together, or neither does. The endpoint ``shop`` must exist (``poller
endpoints add shop URL``). Run it twice: the second run pays no new invoice
and enqueues nothing new (the idempotency key is the invoice's).
"""

from __future__ import annotations

import os

from sqlalchemy import Boolean, Column, Integer, MetaData, Table, create_engine, insert, select
from sqlalchemy.orm import Session

from poller import enqueue

# SQLAlchemy needs the driver in the URL: psycopg 3, which webhook-poller installs.
DATABASE_URL = os.environ["POLLER_DATABASE_URL"].replace(
    "postgresql://", "postgresql+psycopg://", 1
)

metadata = MetaData()
invoices = Table(  # the application's own table, beside the poller_* tables
    "invoices",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("paid", Boolean, nullable=False),
)


def pay(session: Session, invoice_id: int) -> int:
    """Mark the invoice paid and enqueue its webhook, in the caller's transaction."""
    if session.execute(select(invoices.c.id).where(invoices.c.id == invoice_id)).first() is None:
        session.execute(insert(invoices).values(id=invoice_id, paid=True))
    return enqueue(
        session,
        endpoint="shop",
        event_type="invoice.paid",
        payload={"invoice": invoice_id, "amount": "19.90"},
        idempotency_key=f"invoice:{invoice_id}:paid",
    )


def main() -> None:
    engine = create_engine(DATABASE_URL)
    metadata.create_all(engine)
    with Session(engine) as session, session.begin():  # commits both, or neither
        message_id = pay(session, 42)
    engine.dispose()
    print(f"invoice 42 paid; webhook message {message_id} will be delivered by `poller run`")


if __name__ == "__main__":
    main()
