"""The OpenAPI document (poller/web/api/openapi.py): the committed copy is the one the
code makes (a change to the API is a diff of docs/api/openapi.json), it is a valid
OpenAPI 3.1 document, and what the API answers is what it says, route by route."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
from openapi_spec_validator import validate
from sqlalchemy import Engine
from starlette.testclient import TestClient

from poller.access import tokens
from poller.endpoints.registry import create_endpoint
from poller.web.api import openapi
from poller.web.api.routes import OPERATIONS, openapi_document
from tests.integration.test_dashboard import client

COMMITTED = Path(__file__).parents[2] / "docs" / "api" / "openapi.json"


def test_the_committed_document_is_the_one_the_code_makes() -> None:
    made = openapi.text(openapi_document())
    assert COMMITTED.read_text() == made, (
        "the API changed: `make openapi` writes docs/api/openapi.json anew"
    )


def test_the_document_is_valid_openapi_and_covers_every_route() -> None:
    doc = openapi_document()
    validate(doc)  # openapi-spec-validator: the 3.1 schema, refs, parameters
    ids = [op.id for op in OPERATIONS]
    assert len(ids) == len(set(ids))
    listed = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert listed == {(op.method, op.template) for op in OPERATIONS}
    for op in OPERATIONS:
        shown = doc["paths"][op.template][op.method.lower()]
        assert shown["summary"] and shown["description"], op.id
        assert any(s.startswith("2") for s in shown["responses"]), op.id


def _operation(method: str, path: str) -> openapi.Operation:
    for op in OPERATIONS:
        pattern = re.sub(r"\{\w+(:path)?\}", lambda m: ".+" if m[1] else "[^/]+", op.route)
        if op.method == method and re.fullmatch(pattern, path):
            return op
    raise AssertionError(f"no operation for {method} {path}")


class Checked:
    """A client whose every answer is checked against the document's schema for its
    operation and status."""

    def __init__(self, web: TestClient, token: str) -> None:
        self.web, self.token, self.doc = web, token, openapi_document()
        self.seen: set[tuple[str, int]] = set()

    def __call__(self, method: str, path: str, body: Any = None, **headers: str) -> Any:
        answer = self.web.request(
            method, path, json=None if method == "GET" else body if body is not None else {},
            headers={"Authorization": f"Bearer {self.token}", **headers},
        )  # fmt: skip
        op = _operation(method, path.partition("?")[0])
        answers = self.doc["paths"][op.template][op.method.lower()]["responses"]
        assert str(answer.status_code) in answers, (op.id, answer.status_code, answer.text)
        shown = answers[str(answer.status_code)]
        if "$ref" in shown:  # a problem
            ref = "#/components/schemas/Problem"
        else:
            ref = shown["content"]["application/json"]["schema"]["$ref"]
        schema = {"components": self.doc["components"], "$ref": ref}
        jsonschema.Draft202012Validator(schema).validate(answer.json())
        self.seen.add((op.id, answer.status_code))
        return answer.json()


def test_every_answer_is_what_the_document_says(engine: Engine) -> None:
    with engine.begin() as conn:
        create_endpoint(conn, "shop", "https://shop.example/in", event_types=["order.*"],
                        headers={"X-Key": "k"}, tenant="acme")  # fmt: skip
        admin = tokens.create_token(conn, "admin", "admin")[1]
    with client(engine) as web:
        call = Checked(web, admin)
        call("GET", "/api/v1/endpoints")
        made = call("POST", "/api/v1/endpoints", {"name": "crm", "url": "https://crm.example/in",
                                                  "event_types": ["order.*"]})  # fmt: skip
        assert made["secret"].startswith("whsec_")
        call("POST", "/api/v1/endpoints", {"name": "crm", "url": 7})
        call("PATCH", "/api/v1/endpoints/crm", {"max_attempts": 3, "retry_schedule": [1, 2.5]})
        call("POST", "/api/v1/endpoints/crm/pause", {"until": "2h"})
        call("POST", "/api/v1/endpoints/crm/resume")
        call("POST", "/api/v1/endpoints/crm/rotate-secret", {"signing": "ed25519"})
        call("POST", "/api/v1/endpoints/crm/disable")
        call("POST", "/api/v1/endpoints/crm/enable")
        call("GET", "/api/v1/endpoints/nope")
        sent = call("POST", "/api/v1/endpoints/crm/test")
        assert "message_id" in sent, sent
        event = {"event_type": "order.paid", "payload": {"id": 1}, "idempotency_key": "o-1",
                 "tenant": "acme"}  # fmt: skip
        published = call("POST", "/api/v1/events", event)
        call("GET", f"/api/v1/events/{published['event_id']}")
        call("POST", f"/api/v1/events/{published['event_id']}/replay", {"endpoint": "crm"})
        call("POST", "/api/v1/endpoints/shop/replay", {"since": "1h", "dry_run": True})
        call("GET", "/api/v1/messages?limit=1")
        call("GET", f"/api/v1/messages/{sent['message_id']}")
        call("POST", f"/api/v1/messages/{sent['message_id']}/cancel")
        call("POST", f"/api/v1/messages/{sent['message_id']}/retry")
        call("PUT", "/api/v1/event-types/order.paid", {"description": "Paid", "schema": {
             "type": "object", "required": ["id"]}, "example": {"id": 1}})  # fmt: skip
        call("GET", "/api/v1/event-types")
        call("GET", "/api/v1/event-types/order.paid")
        call("DELETE", "/api/v1/event-types/order.paid")
        call("DELETE", "/api/v1/endpoints/crm?force=true")
    assert {s for _, s in call.seen} >= {200, 201, 202, 404, 409, 422}
    assert len({op for op, _ in call.seen}) >= 20
