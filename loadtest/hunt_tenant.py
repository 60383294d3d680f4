"""The fault hunt's third person: a tenant's integration, through the management API
(loadtest/hunt.py), and publishes the event-type catalog must refuse.

**The tenant** holds a ``tenant:acme`` token and calls the API (the dashboard's app, in
process) at the planned times, while the pollers deliver and the faults land. Most of
its calls aim at what is not acme's: the hunt's endpoint (no tenant), its messages and
its events — every route that takes a name or an id, reads and changes alike (retry,
cancel, pause, disable, rotate, test, replay, update, delete). Each must answer 404,
as for what does not exist, and change nothing; the verdict also looks for any trace
of acme's token on the hunt's rows. The rest aim at acme's own endpoint (which nothing
publishes to, so it adds no row the verdict would have to account for): anything but
a 5xx is fine there.

**Overreach**: at other planned times the tenant tries what it may not on its own
endpoint — a capacity or retry-policy field (each must be refused 403, and acme's
endpoint keep the operator's settings to the end) — and sends a create again with
its ``Idempotency-Key`` after rotating the new endpoint's secret: the replay must
carry no secret, neither the first nor the rotated one.

**The catalog**: ``hunt.strict`` has a JSON Schema. At the planned times a publish of a
payload that breaks it (through ``publish()`` and through the API) must be refused,
leaving no event and no row, and never reach the receiver; one that meets it is
committed as any other and must be delivered.
"""

from __future__ import annotations

import random
import threading
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from poller import publish
from poller.access import tokens
from poller.endpoints.registry import create_endpoint
from poller.errors import PayloadInvalid
from poller.outbox.catalog import define_event_type
from poller.settings import load_settings
from poller.web import auth
from poller.web.app import create_app

if TYPE_CHECKING:
    from loadtest.hunt import Run

TENANT = "acme"
OWN = "acme-own"
STRICT = "hunt.strict"
SCHEMA = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
CALLS = 6  # API calls per planned step
PATIENCE = 20.0  # seconds a step's calls wait out PostgreSQL restarting
# (method, path template, body): {name} the hunt's endpoint or acme's, {id} a message's,
# {event} an event's. None: the route takes no body.
ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("GET", "/api/v1/endpoints/{name}", None),
    ("PATCH", "/api/v1/endpoints/{name}", {"rate_limit": 1000}),
    ("POST", "/api/v1/endpoints/{name}/pause", {"until": "2s"}),
    ("POST", "/api/v1/endpoints/{name}/resume", {}),
    ("POST", "/api/v1/endpoints/{name}/disable", {}),
    ("POST", "/api/v1/endpoints/{name}/enable", {}),
    ("POST", "/api/v1/endpoints/{name}/rotate-secret", {}),
    ("POST", "/api/v1/endpoints/{name}/test", {}),
    ("POST", "/api/v1/endpoints/{name}/replay", {"since": "1h"}),
    ("DELETE", "/api/v1/endpoints/{name}?force=true", {}),
    ("GET", "/api/v1/messages/{id}", None),
    ("POST", "/api/v1/messages/{id}/retry", {}),
    ("POST", "/api/v1/messages/{id}/cancel", {}),
    ("GET", "/api/v1/events/{event}", None),
    ("POST", "/api/v1/events/{event}/replay", {"endpoint": OWN}),
)
OWN_ROUTES = ("GET", "PATCH", "pause", "resume", "disable", "enable", "rotate-secret")
# What a tenant may not set, even on its own endpoint: capacity and retry policy are
# the operator's (each must be refused 403, and leave the endpoint as it was).
CAPACITY = (
    {"max_in_flight": 2**31 - 1}, {"max_attempts": 1000}, {"retry_schedule": [0.001]},
    {"circuit_failures": 0}, {"timeout": 3600}, {"rate_limit": 1000000}, {"max_age": 1},
)  # fmt: skip
CAPACITY_FIELDS = sorted({name for change in CAPACITY for name in change})


def prepare(conn: Any, receiver_url: str) -> str:
    """acme's endpoint, acme's token and the strict event type; the token."""
    create_endpoint(conn, OWN, f"{receiver_url}/acme", tenant=TENANT, event_types=["acme.*"],
                    allow_private=True)  # fmt: skip
    define_event_type(conn, STRICT, description="The hunt's strict events", schema=SCHEMA,
                      example={"n": 1})  # fmt: skip
    return tokens.create_token(conn, "hunt-acme", f"tenant:{TENANT}")[1]


def tenant(engine: Any, run: Run, token: str, stop: threading.Event) -> None:
    """The tenant's API calls and the strict publishes at the planned times."""
    from loadtest.hunt_actors import _wait_until, failure

    rng = random.Random(run.plan.seed * 131 + 5)
    app = create_app(load_settings(), engine, auth.Credentials("hunt-tenant-dashboard-0"))
    with TestClient(app, base_url="http://127.0.0.1:8188", raise_server_exceptions=False) as web:
        web.headers["authorization"] = f"Bearer {token}"
        for n, (at, kind) in enumerate(sorted(run.plan.tenant)):
            if not _wait_until(run.began, at, stop):
                break
            try:
                if kind == "strict":
                    _strict(engine, run, web, n)
                elif kind == "overreach":
                    _overreach(run, web, rng, n)
                else:
                    deadline = time.monotonic() + PATIENCE
                    for _ in range(CALLS):
                        _call(engine, run, web, rng, deadline, stop)
            except Exception as exc:  # not PostgreSQL restarting: _call waits that out
                run.tenant_log.append(f"{kind} failed: {type(exc).__name__}")
                failure(run, f"the tenant's {kind}", exc)
    run.tenant_done.set()


def _foreign_ids(engine: Any) -> tuple[list[int], list[int]]:
    with engine.connect() as conn:
        messages = list(conn.execute(text(
            "SELECT o.id FROM poller_outbox o JOIN poller_endpoints e ON e.id = o.endpoint_id "
            "WHERE e.name = 'hostile' ORDER BY random() LIMIT 5")).scalars())  # fmt: skip
        events = list(conn.execute(text(
            "SELECT id FROM poller_events WHERE tenant IS NULL ORDER BY random() LIMIT 5"
        )).scalars())  # fmt: skip
    return messages, events


def _call(
    engine: Any,
    run: Run,
    web: TestClient,
    rng: random.Random,
    deadline: float,
    stop: threading.Event,
) -> None:
    """One call, made again while PostgreSQL is away (this thread's own reads fail, the
    API answers 503) until ``deadline``: a restart that lands on the step must not leave
    the tenant with no call answered, and the hunt with nothing checked."""
    method, template, body = rng.choice(ROUTES)
    own = "{name}" in template and rng.random() < 0.3
    if own and not any(template.endswith(r) or method == r for r in OWN_ROUTES):
        own = False  # acme's endpoint: nothing that would send or delete
    while True:
        try:
            ids: tuple[list[int], list[int]] | None = _foreign_ids(engine)
        except DBAPIError:  # PostgreSQL restarting
            ids = None
        if ids is not None:
            messages, events = ids
            path = template.replace("{name}", OWN if own else "hostile")
            path = path.replace("{id}", str(rng.choice(messages or [1])))
            path = path.replace("{event}", str(rng.choice(events or [1])))
            answer = web.request(method, path, json=body)
            if answer.status_code != 503 or time.monotonic() > deadline:
                break
        elif time.monotonic() > deadline:
            run.tenant_log.append(f"{method} {template}: PostgreSQL away past the step")
            return
        if stop.wait(0.1):
            return
    run.tenant_log.append(f"{method} {path} {answer.status_code}")
    if answer.status_code >= 500 and answer.status_code != 503:  # 503: PostgreSQL away
        run.tenant_wrong.append(f"{method} {path} answered {answer.status_code}")
    elif not own and answer.status_code not in (404, 503):
        run.tenant_wrong.append(f"{method} {path} answered {answer.status_code}, not 404")


def _overreach(run: Run, web: TestClient, rng: random.Random, n: int) -> None:
    """What a tenant may try on its own: a capacity field (403, nothing changed), and
    a create sent again with its Idempotency-Key after the secret was rotated (the
    replay carries no secret, neither the first nor the rotated one)."""
    change = rng.choice(CAPACITY)
    answer = web.patch(f"/api/v1/endpoints/{OWN}", json=change)
    run.tenant_log.append(f"PATCH {OWN} {sorted(change)} {answer.status_code}")
    if answer.status_code not in (403, 503):
        run.tenant_wrong.append(f"PATCH {sorted(change)} answered {answer.status_code}, not 403")
    key = {"idempotency-key": f"hunt-create-{run.plan.seed}-{n}"}
    body = {"url": "http://127.0.0.1:9/acme-extra", "event_types": ["acme.none"]}
    first = web.post("/api/v1/endpoints", json=body, headers=key)
    if first.status_code != 201:
        if first.status_code >= 500 and first.status_code != 503:
            run.tenant_wrong.append(f"a create answered {first.status_code}")
        return
    name = first.json()["name"]
    web.post(f"/api/v1/endpoints/{name}/rotate-secret", json={})
    again = web.post("/api/v1/endpoints", json=body, headers=key)
    run.tenant_log.append(f"create {name} again after a rotation {again.status_code}")
    if again.status_code == 201 and ("secret" in again.json() or again.json()["name"] != name):
        run.tenant_wrong.append(f"a create's replay after a rotation showed {sorted(again.json())}")
    elif again.status_code not in (201, 503):
        run.tenant_wrong.append(f"a create's replay answered {again.status_code}")
    web.delete(f"/api/v1/endpoints/{name}")


def _strict(engine: Any, run: Run, web: TestClient, n: int) -> None:
    """One bad payload through publish() and one through the API; one good one."""
    bad = f"strict-bad-{n}"
    run.strict_refused.add(bad)
    try:
        with Session(engine) as session:
            publish(session, event_type=STRICT, payload={"n": "seven", "bad": True},
                    idempotency_key=bad)  # fmt: skip
            session.commit()
        run.tenant_wrong.append(f"{bad}: publish() took a payload its schema refuses")
    except PayloadInvalid:
        pass
    through_api = f"strict-bad-api-{n}"
    run.strict_refused.add(through_api)
    answer = web.post("/api/v1/events", json={"event_type": STRICT, "payload": {"bad": True},
                                              "idempotency_key": through_api})  # fmt: skip
    if answer.status_code not in (422, 503):
        run.tenant_wrong.append(f"{through_api}: the API answered {answer.status_code}, not 422")
    good = f"strict-ok-{n}"
    with Session(engine) as session:
        publish(session, event_type=STRICT, payload={"n": n}, idempotency_key=good)
        session.commit()
    run.committed_now({good})


def disagrees(engine: Any, run: Run, receiver_posts: dict[str, int]) -> list[str]:
    """The tenant's invariants: every foreign call a 404, no trace of acme's token on the
    hunt's rows, no refused payload kept or sent."""
    with engine.connect() as conn:
        touched = list(conn.execute(text(
            "SELECT DISTINCT a.message_id FROM poller_delivery_attempts a "
            "JOIN poller_endpoints e ON e.id = a.endpoint_id "
            "WHERE e.name = 'hostile' AND a.poller_id LIKE '%hunt-acme%'")).scalars())  # fmt: skip
        marked = conn.execute(text(
            "SELECT coalesce(disabled_reason, '') || coalesce(held_by, '') FROM poller_endpoints "
            "WHERE name = 'hostile'")).scalar_one()  # fmt: skip
        capacity = conn.execute(text(
            f"SELECT {', '.join(CAPACITY_FIELDS)} FROM poller_endpoints WHERE name = :own"
        ), {"own": OWN}).one_or_none()  # fmt: skip
        kept = list(conn.execute(text(
            "SELECT idempotency_key FROM poller_events WHERE idempotency_key = ANY(:keys) "
            "UNION SELECT idempotency_key FROM poller_outbox WHERE idempotency_key = ANY(:keys)"
        ), {"keys": sorted(run.strict_refused)}).scalars())  # fmt: skip
    problems = [f"tenant acme: {w}" for w in run.tenant_wrong[:5]]
    if touched:
        problems.append(f"{len(touched)} of the hunt's messages retried or cancelled by acme")
    if "hunt-acme" in marked:
        problems.append(f"the hunt's endpoint disabled or paused by acme: {marked[:80]!r}")
    if capacity is not None and any(value is not None for value in capacity):
        problems.append(f"acme changed its endpoint's capacity: {dict(capacity._mapping)}")
    sent = sorted(k for k in run.strict_refused if receiver_posts.get(k))
    if kept or sent:
        problems.append(f"payloads the catalog refuses kept {kept[:3]} or sent {sent[:3]}")
    return problems
