"""One trace from a Flask request to the webhook's receiver: the shop enqueues inside its
request's span; the receiver continues the trace the delivery carries.

    pip install flask opentelemetry-sdk opentelemetry-instrumentation-flask
    eval "$(poller embedded start)" && poller db upgrade
    flask --app examples/traced_flask:shop run --port 8000        # the shop
    flask --app examples/traced_flask:receiver run --port 8080    # the receiver
    POLLER_ALLOW_PRIVATE_TARGETS=true poller endpoints add shop http://127.0.0.1:8080/webhooks
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 poller run  # its spans, to a collector
    curl -X POST http://127.0.0.1:8000/orders/7/pay

``shop`` needs nothing of webhook-poller's for the trace: the enqueue stores the
current span's context with the message (``FlaskInstrumentor`` makes the span; here a
``tracer.start_as_current_span`` does, so the example runs without it). ``receiver``
reads the ``traceparent`` the delivery carries and does its work in a child span: the
shop's request, each attempt, and the receiver's handling are one trace.
"""

from __future__ import annotations

import functools
import os

from flask import Flask, request
from opentelemetry import propagate, trace
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

from poller import enqueue

tracer = trace.get_tracer("shop")

shop = Flask("shop")


@functools.cache
def engine() -> Engine:
    """The shop's database, which holds the poller's tables too (one engine a process)."""
    url = os.environ["POLLER_DATABASE_URL"]
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


@shop.post("/orders/<int:order_id>/pay")
def pay(order_id: int) -> dict[str, bool]:
    with (
        tracer.start_as_current_span("POST /orders/{id}/pay"),  # FlaskInstrumentor's job
        Session(engine()) as session,
        session.begin(),
    ):
        # ... mark the order paid, in this transaction ...
        enqueue(
            session,
            endpoint="shop",
            event_type="order.paid",
            payload={"order": order_id},
            idempotency_key=f"order:{order_id}:paid",
        )
    return {"ok": True}


receiver = Flask("receiver")
handled: list[tuple[int, int]] = []  # (trace id, parent span id) of each handled webhook


@receiver.post("/webhooks")
def receive() -> tuple[str, int]:
    # (verify the signature first: examples/flask_receiver.py)
    context = propagate.extract(request.headers)  # the traceparent (names: any case)
    with tracer.start_as_current_span("handle order.paid", context=context) as span:
        parent = trace.get_current_span(context).get_span_context()
        handled.append((span.get_span_context().trace_id, parent.span_id))
        # ... apply the event, once per webhook-id ...
    return "", 204
