"""The receiver example in examples/ works against what the poller really sends."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime
from types import ModuleType

import pytest
from sqlalchemy import Engine, text

from poller.delivery import webhook_headers
from poller.endpoints import Endpoint
from tests.conftest import make_endpoint, repo_root

SECRET = "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, repo_root() / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _endpoint() -> Endpoint:
    now = datetime.now(UTC)
    return Endpoint(
        1, "shop", "http://x/webhooks", None, True, None, None, None, None, 0, now, now, SECRET
    )


def test_the_flask_receiver_verifies_applies_once_and_answers_lookups() -> None:
    client = _example("flask_receiver").app.test_client()
    body = b'{"order":7}'
    headers = webhook_headers(_endpoint(), "order:7", body, "webhook-poller/test")
    assert client.get("/webhooks/order:7").status_code == 404
    assert client.post("/webhooks", data=body, headers=headers).status_code == 204
    assert client.post("/webhooks", data=body, headers=headers).status_code == 204  # again: no-op
    assert client.get("/webhooks/order:7").status_code == 200
    forged = {**headers, "webhook-signature": "v1,AAAA"}
    assert client.post("/webhooks", data=body, headers=forged).status_code == 401


def test_the_first_webhook_tutorial_runs_as_written(
    db_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/tutorials/first-webhook.md includes examples/first_webhook.py: run it, with the
    URL as `poller embedded start` prints it, twice."""
    make_endpoint(engine, "shop")
    monkeypatch.setenv("POLLER_DATABASE_URL", db_url)  # postgresql://…, as printed
    example = _example("first_webhook")
    example.main()
    example.main()  # the same invoice: the same message, nothing new
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT endpoint_id, event_type, idempotency_key FROM poller_outbox")
        ).all()
        paid = conn.execute(text("SELECT id, paid FROM invoices")).all()
    assert [(r.event_type, r.idempotency_key) for r in rows] == [
        ("invoice.paid", "invoice:42:paid")
    ]
    assert paid == [(42, True)]
