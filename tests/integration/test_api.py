"""The management API (poller/web/api/routes.py): tokens or the operator's credentials,
a tenant's token seeing its tenant alone (anything else 404, as for nothing), and every
failure a problem document."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from poller import Message, enqueue_many
from poller.access import tokens
from poller.endpoints.registry import create_endpoint, make_room
from poller.errors import TenantFull
from poller.settings import default_settings
from tests.integration.test_dashboard import TOKEN, client
from tests.integration.test_ordering import _lock_waits

PLANTED = "planted-api-credential-55"  # a header's value; with the secrets, never shown
SECRETS: list[str] = []
PROBLEM = "application/problem+json"
STATE = (
    "SELECT (SELECT count(*) FROM poller_outbox), (SELECT max(updated_at) FROM poller_outbox), "
    "(SELECT count(*) FROM poller_endpoints), (SELECT max(updated_at) FROM poller_endpoints)"
)


@pytest.fixture
def api(engine: Engine) -> Iterator[tuple[TestClient, dict[str, str]]]:
    with engine.begin() as conn:
        for name, tenant in (("billing", None), ("acme-hooks", "acme"), ("acme-audit", "acme"),
                             ("globex-hooks", "globex")):  # fmt: skip
            created = create_endpoint(
                conn, name, f"https://{name}.example/in", event_types=["order.*"],
                tenant=tenant, headers={"Authorization": PLANTED},
            )  # fmt: skip
            SECRETS.append(created.secret)
        made = {
            scope: tokens.create_token(conn, scope.replace(":", "-"), scope)[1]
            for scope in ("admin", "tenant:acme", "tenant:globex")
        }
    with client(engine) as web:
        yield web, made


def _get(web: TestClient, path: str, token: str | None) -> tuple[int, dict[str, object], str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = web.get(path, headers=headers)
    assert PLANTED not in answer.text and not any(s in answer.text for s in SECRETS)
    return answer.status_code, answer.json(), answer.headers["content-type"]


def test_a_tenants_token_sees_its_tenant_alone(api: tuple[TestClient, dict[str, str]]) -> None:
    web, made = api
    status, body, _ = _get(web, "/api/v1/endpoints", made["tenant:acme"])
    assert status == 200 and [e["name"] for e in body["data"]] == ["acme-audit", "acme-hooks"]  # type: ignore[index]
    status, body, _ = _get(web, "/api/v1/endpoints/acme-hooks", made["tenant:acme"])
    assert status == 200 and body["tenant"] == "acme" and body["headers"] == ["Authorization"]
    status, other, kind = _get(web, "/api/v1/endpoints/globex-hooks", made["tenant:acme"])
    _, missing, _ = _get(web, "/api/v1/endpoints/globex-hookz", made["tenant:acme"])
    assert status == 404 and kind == PROBLEM
    assert other.keys() == missing.keys() and other["title"] == missing["title"]
    assert "globex" in str(other["detail"])  # the name asked for, as for one that is not there
    status, body, _ = _get(web, "/api/v1/endpoints/billing", made["tenant:globex"])
    assert status == 404
    pages = []  # a page at a time, chosen by PostgreSQL among the tenant's alone
    for after in ("", "acme-audit", "acme-hooks", "acme-hooks~"):
        status, body, _ = _get(web, f"/api/v1/endpoints?limit=1&after={after}", made["tenant:acme"])
        pages.append(([e["name"] for e in body["data"]], body["next"]))  # type: ignore[attr-defined]
    assert pages == [(["acme-audit"], "acme-audit"), (["acme-hooks"], None), ([], None), ([], None)]


def test_admin_and_the_operator_see_everything_a_page_at_a_time(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    web, made = api
    names: list[str] = []
    after = ""
    while True:
        status, body, _ = _get(web, f"/api/v1/endpoints?limit=3&after={after}", made["admin"])
        assert status == 200
        names += [e["name"] for e in body["data"]]  # type: ignore[attr-defined]
        if body["next"] is None:
            break
        after = str(body["next"])
    assert names == ["acme-audit", "acme-hooks", "billing", "globex-hooks"]
    status, body, _ = _get(web, "/api/v1/endpoints", TOKEN)  # the dashboard's own token
    assert status == 200 and len(body["data"]) == 4  # type: ignore[arg-type]


def test_a_bad_page_is_a_problem(api: tuple[TestClient, dict[str, str]]) -> None:
    web, made = api
    for limit in ("0", "501", "-1", "ten", "1e3"):  # one fixture for all: they change nothing
        status, body, kind = _get(web, f"/api/v1/endpoints?limit={limit}", made["admin"])
        assert (status, kind, body["status"]) == (422, PROBLEM, 422), limit
        assert "limit" in str(body["detail"])
    # a cursor PostgreSQL could not take: no NUL reaches a statement
    status, body, kind = _get(web, "/api/v1/endpoints?after=%00", made["admin"])
    assert (status, kind) == (422, PROBLEM) and "after" in str(body["detail"])


def test_no_wrong_or_ended_token_gets_in(
    engine: Engine, api: tuple[TestClient, dict[str, str]]
) -> None:
    web, made = api
    with engine.begin() as conn:
        tokens.revoke_token(conn, "tenant-globex")
    login = web.get(f"/login?token={TOKEN}")  # a dashboard session is not an API credential
    assert login.status_code == 303
    for token in (None, made["tenant:globex"], made["admin"][:-2] + "xx", "wpt_", "nonsense"):
        answer = web.get(
            "/api/v1/endpoints", headers={"Authorization": f"Bearer {token}"} if token else {}
        )
        assert answer.status_code == 401 and answer.headers["content-type"] == PROBLEM, token
        assert "bearer" in answer.headers["www-authenticate"].lower()
        assert token is None or token not in answer.text
    wrong = [
        web.get("/api/v1/endpoints", headers={"Authorization": "Bearer wpt_" + "x" * 43})
        for _ in range(20)
    ]
    assert wrong[-1].status_code == 429 and wrong[-1].headers["content-type"] == PROBLEM


def test_wrong_tokens_from_an_address_hold_up_no_right_one(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    """Behind one ingress every tenant shares an address: twenty wrong tokens from it
    are answered 429 past the limit, and another tenant's right token still gets in
    (it used to wait 60 s)."""
    web, made = api
    for _ in range(20):
        web.get("/api/v1/endpoints", headers={"Authorization": "Bearer wpt_" + "x" * 43})
    answer = web.get(
        "/api/v1/endpoints", headers={"Authorization": f"Bearer {made['tenant:acme']}"}
    )
    assert answer.status_code == 200


def test_the_dashboards_session_cookie_is_no_api_credential(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    """A browser adds the cookie by itself: with it, a wrong bearer or a basic header the
    dashboard does not use is still refused."""
    web, _ = api
    assert web.get(f"/login?token={TOKEN}").status_code == 303
    for header in ("Bearer not-the-token", "Basic " + "b3A6b3A=", "Token x"):
        answer = web.get("/api/v1/endpoints", headers={"Authorization": header})
        assert answer.status_code == 401, header


def _post(
    web: TestClient, token: str, body: object, **headers: str
) -> tuple[int, dict[str, object]]:
    answer = web.post(
        "/api/v1/events",
        content=body if isinstance(body, bytes) else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", **headers},
    )
    assert "Traceback" not in answer.text
    return answer.status_code, answer.json()


def _rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM poller_events")).scalar_one())


def test_a_tenants_token_publishes_as_its_tenant_once_per_key(
    engine: Engine, api: tuple[TestClient, dict[str, str]]
) -> None:
    web, made = api
    event = {"event_type": "order.paid", "payload": {"order": 7}, "idempotency_key": "o7"}
    status, body = _post(web, made["tenant:acme"], event)
    assert status == 201 and sorted(body["deliveries"]) == ["acme-audit", "acme-hooks"]  # type: ignore[arg-type]
    again, same = _post(web, made["tenant:acme"], event, **{"Idempotency-Key": "o7"})
    assert again == 200 and same["event_id"] == body["event_id"] and same["created"] is False
    status, body = _post(web, made["tenant:acme"], {**event, "payload": {"order": 8}})
    assert status == 409
    status, body = _post(
        web, made["tenant:acme"], {**event, "tenant": "globex", "idempotency_key": "g"}
    )
    assert status == 422 and "publishes as acme" in str(body["detail"])
    status, body = _post(web, made["admin"], {**event, "tenant": "globex"})
    assert status == 201 and list(body["deliveries"]) == ["globex-hooks"]  # type: ignore[arg-type]
    assert _rows(engine) == 2


BAD_EVENTS = [
    (b"not json", 422, "not JSON"),
    (b'{"event_type": "e", "payload": {"a": NaN}, "idempotency_key": "k"}', 422, "NaN is not"),
    (b'{"event_type": "e", "payload": {"a": 1e999999}, "idempotency_key": "k"}', 422, "range"),
    (b"[1, 2]", 422, "JSON object"),
    (b"[" * 100_000 + b"]" * 100_000, 422, "nests 100000 levels deep; at most 127"),
    (b"[" * 5_000 + b"]" * 5_000, 422, "nests 5000 levels deep"),  # not Python's stack
    ({"event_type": "e", "payload": {}}, 422, "idempotency_key: Field required"),
    (
        {"event_type": "e", "payload": {}, "idempotency_key": "k", "extra": 1},
        422,
        "extra: Extra inputs are not permitted",
    ),
    ({"event_type": "e\x00", "payload": {}, "idempotency_key": "k"}, 422, "event"),
    ({"event_type": 7, "payload": {}, "idempotency_key": "k"}, 422, "event_type"),
    ({"event_type": "e", "payload": {}, "idempotency_key": "k k"}, 422, "idempotency_key"),
    ({"event_type": "e", "payload": "x", "idempotency_key": "k"}, 422, "JSON object"),
    ({"event_type": "e", "payload": {"x": "x" * 400_000}, "idempotency_key": "k"}, 413, "over"),
]


def test_a_bad_event_is_a_problem_and_writes_nothing(
    engine: Engine, api: tuple[TestClient, dict[str, str]]
) -> None:
    web, made = api
    for body, status, said in BAD_EVENTS:
        got, problem = _post(web, made["admin"], body)
        assert got == status and said in str(problem["detail"]), problem
    assert _rows(engine) == 0


def test_publishing_needs_json_and_a_token_that_may_write(
    engine: Engine, api: tuple[TestClient, dict[str, str]]
) -> None:
    web, made = api
    with engine.begin() as conn:
        _, reader = tokens.create_token(conn, "reader", "admin", read_only=True)
    event = {"event_type": "order.paid", "payload": {}, "idempotency_key": "r"}
    assert _post(web, reader, event)[0] == 403
    form = web.post("/api/v1/events", data={"event_type": "x"},  # what another site's form sends
                    headers={"Authorization": f"Bearer {made['admin']}"})  # fmt: skip
    assert form.status_code == 415 and form.headers["content-type"] == PROBLEM
    assert _rows(engine) == 0


def test_a_tenant_reads_its_messages_alone(
    engine: Engine, api: tuple[TestClient, dict[str, str]]
) -> None:
    web, made = api
    for tenant, key in (("acme", "a1"), ("globex", "g1"), ("acme", "a2")):
        event = {"event_type": "order.paid", "payload": {"k": key}, "idempotency_key": key,
                 "tenant": tenant}  # fmt: skip
        assert _post(web, made["admin"], event)[0] == 201
    status, body, _ = _get(web, "/api/v1/messages?limit=2", made["tenant:acme"])
    assert status == 200 and len(body["data"]) == 2 and body["next"]  # type: ignore[arg-type]
    status, rest, _ = _get(web, f"/api/v1/messages?after={body['next']}", made["tenant:acme"])
    mine = body["data"] + rest["data"]  # type: ignore[operator]
    assert {m["endpoint"] for m in mine} == {"acme-hooks", "acme-audit"} and len(mine) == 4
    status, one, _ = _get(web, f"/api/v1/messages/{mine[0]['id']}", made["tenant:acme"])
    assert status == 200 and one["payload"] == {"k": "a2"} and one["attempts_log"] == []
    assert "claim_token" not in one and "traceparent" not in one
    _, theirs, _ = _get(web, "/api/v1/messages?endpoint=globex-hooks", made["admin"])
    (globex,) = theirs["data"]  # type: ignore[misc]
    status, hidden, _ = _get(web, f"/api/v1/messages/{globex['id']}", made["tenant:acme"])
    _, absent, _ = _get(web, "/api/v1/messages/999999", made["tenant:acme"])
    assert status == 404 and hidden["detail"] == f"no message {globex['id']}"
    assert absent["detail"] == "no message 999999"
    for query in ("?endpoint=globex-hooks", "?status=lost", "?after=x", "/0", "/1e3"):
        status, problem, kind = _get(web, f"/api/v1/messages{query}", made["tenant:acme"])
        assert status in (404, 422) and kind == PROBLEM, (query, problem)
    status, body, _ = _get(web, "/api/v1/messages?status=pending&event_type=order.paid",
                           made["tenant:globex"])  # fmt: skip
    assert status == 200 and [m["idempotency_key"] for m in body["data"]] == ["g1"]  # type: ignore[index]


def test_every_route_hides_every_other_tenants_resource(
    engine: Engine, api: tuple[TestClient, dict[str, str]]
) -> None:
    """Each route of the API (a new one is covered, or this fails on its parameter), for
    acme's token, with each of globex's and the untenanted endpoints and messages: 404,
    or a list without them; and nothing changed, by reads or by changes (retry, cancel
    of another tenant's message)."""
    from poller.web.api.routes import OPERATIONS

    web, made = api
    events = {}
    for tenant, key in (("globex", "g1"), (None, "b1"), ("acme", "a1")):
        event = {"event_type": "order.paid", "payload": {}, "idempotency_key": key,
                 "tenant": tenant}  # fmt: skip
        status, published = _post(web, made["admin"], event)
        assert status == 201
        events[tenant] = str(published["event_id"])
    _, everything, _ = _get(web, "/api/v1/messages", made["admin"])
    foreign = {"name": ["globex-hooks", "billing"],
               "id": [str(m["id"]) for m in everything["data"] if m["endpoint"] in  # type: ignore[attr-defined]
                      ("globex-hooks", "billing")],
               "event": [events["globex"], events[None]]}  # fmt: skip
    assert len(foreign["id"]) == 2
    bodies = {"replayToEndpoint": {"since": "1h"}, "replayEvent": {"endpoint": "acme-hooks"}}
    with engine.connect() as conn:
        before = conn.execute(text(STATE)).one()
    checked = 0
    for op in OPERATIONS:
        if op.route.startswith("/api/v1/event-types"):
            continue  # the catalog is everyone's (its own test)
        params = re.findall(r"{([^}:]+)", op.route)  # name or id
        if op.method != "GET" and not params:
            continue  # publish and create: as its own tenant, by their own tests
        if not params:
            status, body, _ = _get(web, op.route, made["tenant:acme"])
            assert status == 200 and "globex" not in str(body) and "billing" not in str(body)
            checked += 1
            continue
        kind = "event" if op.route.startswith("/api/v1/events/") else params[0]
        for value in foreign[kind]:
            path = re.sub(r"{[^}]+}", value, op.route)
            answer = web.request(op.method, path, json=bodies.get(op.id, {}), headers={
                "Authorization": f"Bearer {made['tenant:acme']}"})  # fmt: skip
            assert (answer.status_code, answer.headers["content-type"]) == (404, PROBLEM), (
                op.method, path, answer.text)  # fmt: skip
            checked += 1
    for name in foreign["name"]:  # acme's own event, replayed to another tenant's endpoint
        answer = web.post(f"/api/v1/events/{events['acme']}/replay", json={"endpoint": name},
                          headers={"Authorization": f"Bearer {made['tenant:acme']}"})  # fmt: skip
        assert answer.status_code == 404, answer.text
    assert checked >= 30  # 2 lists; 10 name routes and 5 id routes, 2 foreign values each
    with engine.connect() as conn:
        after = conn.execute(text(STATE)).one()
    assert tuple(before) == tuple(after)


def test_a_tenant_retries_and_cancels_its_own_messages(
    engine: Engine, api: tuple[TestClient, dict[str, str]]
) -> None:
    web, made = api
    event = {"event_type": "order.paid", "payload": {}, "idempotency_key": "r1"}
    _, body = _post(web, made["tenant:acme"], event)
    first, second = sorted(body["deliveries"].values())  # type: ignore[attr-defined]
    auth = {"Authorization": f"Bearer {made['tenant:acme']}"}

    def act(verb: str, message: int, **headers: str) -> tuple[int, str]:
        answer = web.post(
            f"/api/v1/messages/{message}/{verb}", json={}, headers={**auth, **headers}
        )
        return answer.status_code, answer.text

    assert act("cancel", first)[0] == 200
    code, said = act("cancel", first)
    assert code == 409 and "already cancelled" in said
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_outbox SET status = 'failed', failed_at = now() "
                          "WHERE id = :id"), {"id": second})  # fmt: skip
    assert act("retry", second)[0] == 200 and act("retry", first)[0] == 200
    code, said = act("retry", second)
    assert code == 409 and "is pending" in said
    with engine.connect() as conn:
        statuses = dict(conn.execute(text("SELECT id, status FROM poller_outbox")).all())
        who = conn.execute(text("SELECT DISTINCT poller_id FROM poller_delivery_attempts "
                                "WHERE kind = 'manual'")).scalars().all()  # fmt: skip
    assert statuses == {first: "pending", second: "pending"}
    assert any("token:tenant-acme" in str(w) for w in who), who
    form = web.post(f"/api/v1/messages/{first}/cancel", data={"a": "b"}, headers=auth)
    assert form.status_code == 415  # what another site's form would send: refused


def test_each_token_is_throttled_on_its_own(engine: Engine) -> None:
    from poller.web.auth import Limits

    limits = Limits(2.0)  # bursts of 4, then one every half second
    assert [limits.wait("a", now=0.0) for _ in range(5)] == [0, 0, 0, 0, 0.5]
    assert limits.wait("b", now=0.0) == 0 and limits.wait("a", now=0.5) == 0
    slow = Limits(0.25)  # one every 4 s: its first call is let through, then it waits
    assert [slow.wait("a", now=0.0), slow.wait("a", now=0.0), slow.wait("a", now=4.0)] == [0, 4, 0]
    with engine.begin() as conn:
        _, first = tokens.create_token(conn, "first", "admin")
        _, second = tokens.create_token(conn, "second", "admin")
    # One request in 10 s: on a busy machine eight requests took over a second, and a
    # bucket of 2 a second let six of them through (the timing is the unit's, above).
    with client(engine, api_rate_limit=0.1) as web:
        codes = [_get(web, "/api/v1/endpoints", first)[0] for _ in range(3)]
        assert codes == [200, 429, 429]
        answer = web.get("/api/v1/endpoints", headers={"Authorization": f"Bearer {first}"})
        assert answer.status_code == 429 and int(answer.headers["retry-after"]) >= 1
        assert _get(web, "/api/v1/endpoints", second)[0] == 200


def _send(
    web: TestClient, method: str, path: str, token: str, body: object = None
) -> tuple[int, dict[str, object]]:
    answer = web.request(method, path, json=body if body is not None else {},
                         headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    assert "Traceback" not in answer.text and answer.status_code != 500
    return answer.status_code, answer.json()


def test_a_tenant_makes_changes_and_removes_its_own_endpoints(
    engine: Engine, api: tuple[TestClient, dict[str, str]]
) -> None:
    web, made = api
    acme = made["tenant:acme"]
    hooks = {"url": "https://acme.example/hooks", "event_types": ["order.*"]}
    status, body = _send(web, "POST", "/api/v1/endpoints", acme, hooks)
    assert status == 201 and body["tenant"] == "acme" and str(body["name"]).startswith("ep_")
    assert str(body["secret"]).startswith("whsec_")
    name = str(body["name"])
    status, shown = _send(web, "GET", f"/api/v1/endpoints/{name}", acme)
    assert status == 200 and "secret" not in shown  # shown once, at creation
    status, changed = _send(web, "PATCH", f"/api/v1/endpoints/{name}", acme,
                            {"lookup_url": "https://acme.example/lookup/{idempotency_key}",
                             "headers": {"X-Team": "pay"}})  # fmt: skip
    assert status == 200 and changed["headers"] == ["X-Team"]
    assert _send(web, "PATCH", f"/api/v1/endpoints/{name}", acme, {"tenant": "globex"})[0] == 422
    status, off = _send(web, "POST", f"/api/v1/endpoints/{name}/disable", acme)
    assert (
        status == 200
        and off["enabled"] is False
        and "token:tenant-acme" in str(off["disabled_reason"])
    )
    assert _send(web, "POST", f"/api/v1/endpoints/{name}/enable", acme)[1]["enabled"] is True
    ledger = {"name": "ledger", "url": "https://ledger.example/in", "signing": "ed25519"}
    status, signed = _send(web, "POST", "/api/v1/endpoints", made["admin"], ledger)
    assert (
        status == 201
        and "secret" not in signed
        and str(signed["public_keys"][0]).startswith("whpk_")
    )  # type: ignore[index]
    assert _send(web, "POST", "/api/v1/endpoints", made["admin"],
                 {"name": "ledger", "url": "https://ledger.example/in"})[0] == 409  # fmt: skip
    assert _send(web, "DELETE", f"/api/v1/endpoints/{name}", acme) == (
        200,
        {"name": name, "deleted_messages": 0},
    )
    assert _send(web, "GET", f"/api/v1/endpoints/{name}", acme)[0] == 404


def test_a_tenant_names_only_the_destinations_the_operator_offers(
    engine: Engine, api: tuple[TestClient, dict[str, str]]
) -> None:
    web, made = api
    rabbit = "amqp://app:s3cret@rabbit.example/?exchange=hooks&routing_key=acme"
    status, refused = _send(web, "POST", "/api/v1/endpoints", made["tenant:acme"],
                            {"url": rabbit, "event_types": ["order.*"]})  # fmt: skip
    assert status == 422 and "amqp destinations are not offered" in str(refused["detail"])
    status, shown = _send(web, "POST", "/api/v1/endpoints", made["admin"],
                          {"name": "rabbit", "url": rabbit})  # fmt: skip
    assert (
        status == 201 and shown["url"] == "amqp://rabbit.example/?exchange=hooks&routing_key=acme"
    )
    assert "s3cret" not in json.dumps(_send(web, "GET", "/api/v1/endpoints/rabbit", made["admin"]))


BAD_ENDPOINTS: list[dict[str, object]] = [
    {"url": "https://x.example/"},  # no name, for admin
    {"name": "x"},  # no url
    {"name": "x", "url": "file:///etc/passwd"},
    {"name": "x", "url": 7},
    {"name": "x", "url": "https://x.example/", "max_attempts": "5"},
    {"name": "x", "url": "https://x.example/", "max_attempts": True},
    {"name": "x", "url": "https://x.example/", "max_attempts": -1},
    {"name": "x", "url": "https://x.example/", "timeout": 1e308},
    {"name": "x", "url": "https://x.example/", "max_attempts": 2**40},
    {"name": "x", "url": "https://x.example/", "max_in_flight": 2**31},
    {"name": "x", "url": "https://x.example/", "rate_burst": 2**63},
    {"name": "x", "url": "https://x.example/", "event_types": "order.*"},
    {"name": "x", "url": "https://x.example/", "event_types": [1]},
    {"name": "x", "url": "https://x.example/", "retry_schedule": ["5s"]},
    {"name": "x", "url": "https://x.example/", "headers": {"Host": "evil"}},
    {"name": "x", "url": "https://x.example/", "headers": {"X-A": 1}},
    {"name": "x", "url": "https://x.example/", "payload_filter": []},
    {"name": "x", "url": "https://x.example/", "signing": "rot13"},
    {"name": "x", "url": "https://x.example/", "tenant": None},
    {"name": "x\x00", "url": "https://x.example/"},
    {"name": "x", "url": "https://x.example/", "secret": "whsec_mine"},
]


def test_a_bad_endpoint_is_a_problem_and_makes_nothing(
    engine: Engine, api: tuple[TestClient, dict[str, str]]
) -> None:
    web, made = api
    for body in BAD_ENDPOINTS:
        status, problem = _send(web, "POST", "/api/v1/endpoints", made["admin"], body)
        assert status == 422 and problem["status"] == 422, (body, problem)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM poller_endpoints")).scalar_one() == 4


def test_a_tenant_pauses_resumes_and_rotates_its_endpoint(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    web, made = api
    acme = made["tenant:acme"]
    status, paused = _send(web, "POST", "/api/v1/endpoints/acme-hooks/pause", acme, {"until": "2h"})
    assert status == 200 and "token:tenant-acme" in str(paused["paused"])
    for bad in ({"until": "yesterday"}, {"until": "2000-01-01T00:00:00"}, {"until": 7}, {"x": 1},
                {"until": "9999-12-31T23:59:59-14:00"}):  # fmt: skip
        assert _send(web, "POST", "/api/v1/endpoints/acme-hooks/pause", acme, bad)[0] == 422, bad
    status, resumed = _send(web, "POST", "/api/v1/endpoints/acme-hooks/resume", acme)
    assert status == 200 and resumed["paused"] is None
    status, rotated = _send(web, "POST", "/api/v1/endpoints/acme-hooks/rotate-secret", acme,
                            {"keep_old_for": "1h"})  # fmt: skip
    assert status == 200 and str(rotated["secret"]).startswith("whsec_")
    far = {"keep_old_for": "3000000d"}  # a time in the year 10198: no reader could load it
    assert _send(web, "POST", "/api/v1/endpoints/acme-hooks/rotate-secret", acme, far)[0] == 422
    assert rotated["previous_secret_expires_at"] is not None
    status, switched = _send(web, "POST", "/api/v1/endpoints/acme-hooks/rotate-secret", acme,
                             {"signing": "ed25519"})  # fmt: skip
    assert status == 200 and "secret" not in switched and switched["signing"] == "ed25519"
    for bad in ({"keep_old_for": "forever"}, {"signing": "rot13"}, {"keep_old_for": 5}):
        assert _send(web, "POST", "/api/v1/endpoints/acme-hooks/rotate-secret", acme, bad)[0] == 422


async def test_a_test_event_goes_out_as_any_other_and_its_attempt_shows(
    engine: Engine, db_url: str
) -> None:
    from tests.integration.helpers import wait_for
    from tests.integration.service_helpers import fast_settings, running_poller, running_receiver

    async with running_receiver() as (receiver, url):
        with engine.begin() as conn:
            create_endpoint(conn, "probe-me", f"{url}/in", tenant="acme", event_types=["x"])
            _, token = tokens.create_token(conn, "acme", "tenant:acme")
        with client(engine) as web:
            status, sent = _send(web, "POST", "/api/v1/endpoints/probe-me/test", token)
            assert status == 202
            async with running_poller(db_url, fast_settings()):

                async def arrived() -> bool:
                    return receiver.stats.per_path["/in"] == 1

                await wait_for(arrived, timeout=10)

                def settled() -> dict[str, object]:
                    return _send(web, "GET", f"/api/v1/messages/{sent['message_id']}", token)[1]

                async def delivered() -> bool:
                    return settled()["status"] == "delivered"

                await wait_for(delivered, timeout=10)
            shown = settled()
    assert shown["event_type"] == "webhook_poller.test"
    assert [a["outcome"] for a in shown["attempts_log"]] == ["delivered"]  # type: ignore[union-attr]
    assert shown["attempts_log"][0]["status_code"] == 200  # type: ignore[index]


def test_the_catalog_is_read_by_all_changed_by_admins_and_holds_publishes_to_it(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    web, made = api
    schema = {"type": "object", "required": ["order"], "properties": {"order": {"type": "integer"}}}
    defined = {"description": "An order was paid.", "schema": schema, "example": {"order": 1}}
    acme = made["tenant:acme"]
    assert _send(web, "PUT", "/api/v1/event-types/order.paid", acme, defined)[0] == 403
    status, body = _send(web, "PUT", "/api/v1/event-types/order.paid", made["admin"], defined)
    assert status == 200 and body["schema"] == schema
    status, listed = _send(web, "GET", "/api/v1/event-types", acme)
    assert status == 200 and [t["name"] for t in listed["data"]] == ["order.paid"]  # type: ignore[attr-defined]
    for name in ("order.created", "order.shipped"):
        _send(web, "PUT", f"/api/v1/event-types/{name}", made["admin"], {"description": "x"})
    names, after = [], ""  # a page at a time: each type may weigh 320 KB
    for _ in range(4):
        status, page = _send(web, "GET", f"/api/v1/event-types?limit=2{after}", acme)
        names += [t["name"] for t in page["data"]]  # type: ignore[attr-defined]
        if page["next"] is None:
            break
        after = f"&after={page['next']}"
    assert names == ["order.created", "order.paid", "order.shipped"]
    assert _send(web, "GET", "/api/v1/event-types?limit=101", acme)[0] == 422
    assert _send(web, "GET", "/api/v1/event-types?limit=" + "9" * 5000, acme)[0] == 422
    assert _send(web, "GET", "/api/v1/event-types?after=%00", acme)[0] == 422  # the fuzz's find
    event = {"event_type": "order.paid", "payload": {"order": "seven"}, "idempotency_key": "p1"}
    status, refused = _post(web, acme, event)
    assert status == 422 and "/order" in str(refused["detail"]), refused
    assert _post(web, acme, {**event, "payload": {"order": 7}})[0] == 201
    bad = {**defined, "example": {"order": "x"}}
    assert _send(web, "PUT", "/api/v1/event-types/order.paid", made["admin"], bad)[0] == 422
    assert _send(web, "DELETE", "/api/v1/event-types/order.paid", acme)[0] == 403
    assert _send(web, "DELETE", "/api/v1/event-types/order.paid", made["admin"])[0] == 200
    assert _send(web, "GET", "/api/v1/event-types/order.paid", acme)[0] == 404


def test_messages_are_found_by_when_they_were_made(
    api: tuple[TestClient, dict[str, str]],
) -> None:
    web, made = api
    _post(web, made["admin"], {"event_type": "order.paid", "payload": {}, "idempotency_key": "w",
                               "tenant": "acme"})  # fmt: skip
    for query, found in (("since=1h", 2), ("until=1h", 0), ("since=2999-01-01T00:00:00", 0),
                         ("until=2999-01-01T00:00:00%2B00:00", 2)):  # fmt: skip
        status, body, _ = _get(web, f"/api/v1/messages?{query}", made["tenant:acme"])
        assert status == 200 and len(body["data"]) == found, (query, body)  # type: ignore[arg-type]
    for nasty in ("soon", "99999999999d", "0001-01-01T00:00:00%2B14:00", "9999-12-31T23:59:59",
                  "%00", "2026-13-45", "-5m"):  # fmt: skip
        status, body, kind = _get(web, f"/api/v1/messages?since={nasty}", made["tenant:acme"])
        assert status in (200, 422) and (status == 200 or kind == PROBLEM), (nasty, body)


@pytest.mark.parametrize(
    "field",
    [{"max_in_flight": 2**31 - 1}, {"max_attempts": 2**31 - 1}, {"retry_schedule": [0.001]},
     {"circuit_failures": 0}, {"timeout": 3600}, {"rate_limit": 1000000}, {"max_age": 1},
     {"on_failed_head": "skip"}, {"trace_context": False}, {"rate_burst": 1}],
    ids=lambda f: next(iter(f)),
)  # fmt: skip
def test_capacity_and_retry_policy_are_the_operators(
    api: tuple[TestClient, dict[str, str]], field: dict[str, object]
) -> None:
    """A tenant's token sets none of them, on a new endpoint or its own: 403 naming the
    field; nothing changes. (2**31 - 1 in flight went through, and retrying such an
    endpoint's messages was a 500.)"""
    web, made = api
    acme = made["tenant:acme"]
    status, said = _send(web, "PATCH", "/api/v1/endpoints/acme-hooks", acme, field)
    assert status == 403 and next(iter(field)) in str(said["detail"])
    new = {"url": "https://acme.example/new", **field}
    assert _send(web, "POST", "/api/v1/endpoints", acme, new)[0] == 403
    assert (
        _send(web, "GET", "/api/v1/endpoints/acme-hooks", acme)[1]
        == _send(web, "GET", "/api/v1/endpoints/acme-hooks", made["admin"])[1]
    )


def test_every_door_bounds_capacity_as_the_cli_does(api: tuple[TestClient, dict[str, str]]) -> None:
    web, made = api
    for field, most in (("max_in_flight", 10_000), ("max_attempts", 1000)):
        status, said = _send(web, "PATCH", "/api/v1/endpoints/billing", made["admin"],
                             {field: most + 1})  # fmt: skip
        assert status == 422 and f"at most {most}" in str(said["detail"])
        assert _send(web, "PATCH", "/api/v1/endpoints/billing", made["admin"],
                     {field: most})[0] == 200  # fmt: skip


def test_a_create_sent_again_with_its_key_makes_one_endpoint(
    engine: Engine, api: tuple[TestClient, dict[str, str]]
) -> None:
    """A client that lost the answer and sent the create again gets the endpoint it made
    — its secret only in the first answer, the replay says so; the key with another
    body is a conflict; keys are the caller's; a replay shows only what its caller may
    still see (the secret of a rotation, or of an endpoint moved to another tenant,
    never)."""
    web, made = api
    acme, globex = made["tenant:acme"], made["tenant:globex"]
    body = {"url": "https://acme.example/again", "event_types": ["order.*"]}

    def create(token: str, sent: object, key: str) -> tuple[int, dict[str, object], str]:
        answer = web.post("/api/v1/endpoints", json=sent, headers={
            "Authorization": f"Bearer {token}", "Idempotency-Key": key})  # fmt: skip
        return answer.status_code, answer.json(), answer.headers.get("idempotent-replayed", "")

    first = create(acme, body, "create-1")
    again = create(acme, body, "create-1")
    assert first[0] == again[0] == 201 and (first[2], again[2]) == ("", "true")
    assert str(first[1]["secret"]).startswith("whsec_") and "secret" not in again[1]
    assert "first" in str(again[1]["note"]) and again[1]["name"] == first[1]["name"]
    name = first[1]["name"]
    assert _send(web, "POST", f"/api/v1/endpoints/{name}/rotate-secret", acme)[0] == 200
    assert "secret" not in create(acme, body, "create-1")[1]  # not the rotated one either
    code, said, _ = create(acme, {**body, "url": "https://acme.example/other"}, "create-1")
    assert code == 409 and "different request" in str(said["detail"])
    theirs = create(globex, body, "create-1")  # another caller's key space
    assert theirs[0] == 201 and theirs[1]["name"] != first[1]["name"]
    moved = _send(web, "PATCH", f"/api/v1/endpoints/{name}", made["admin"], {"tenant": "globex"})
    assert moved[0] == 200
    assert create(acme, body, "create-1")[0] == 404  # globex's now: not acme's to see
    assert create(acme, body, "\x7f")[0] == 422  # not printable
    with engine.connect() as conn:
        urls = conn.execute(text("SELECT url FROM poller_endpoints WHERE url LIKE "
                                 "'%acme.example%'")).scalars().all()  # fmt: skip
    assert sorted(urls) == ["https://acme.example/again"] * 2  # acme's one, globex's one


def test_an_event_shows_its_deliveries_and_replays_to_an_endpoint(
    engine: Engine, api: tuple[TestClient, dict[str, str]]
) -> None:
    web, made = api
    acme = made["tenant:acme"]
    status, published = _post(web, acme, {"event_type": "order.paid", "payload": {"n": 1},
                                           "idempotency_key": "e-1"})  # fmt: skip
    assert status == 201
    event_id = published["event_id"]
    status, shown = _send(web, "GET", f"/api/v1/events/{event_id}", acme)
    assert status == 200 and shown["tenant"] == "acme" and shown["payload"] == {"n": 1}
    assert sorted(d["endpoint"] for d in shown["deliveries"]) == ["acme-audit", "acme-hooks"]  # type: ignore[attr-defined]
    assert _send(web, "GET", f"/api/v1/events/{event_id}", made["tenant:globex"])[0] == 404
    with engine.begin() as conn:  # the first delivery ended; a replay sends it again
        conn.execute(text("UPDATE poller_outbox SET status = 'failed', failed_at = now() "
                          "WHERE event_id = :id"), {"id": event_id})  # fmt: skip
    status, done = _send(web, "POST", f"/api/v1/events/{event_id}/replay", acme,
                         {"endpoint": "acme-hooks"})  # fmt: skip
    assert status == 200 and (done["events"], done["resent"]) == (1, 1)
    status, done = _send(web, "POST", "/api/v1/endpoints/acme-audit/replay", acme,
                         {"since": "1h", "dry_run": True})  # fmt: skip
    assert status == 200 and (done["events"], done["resent"], done["dry_run"]) == (1, 1, True)
    with engine.begin() as conn:  # no longer subscribed: nothing to replay
        conn.execute(text("UPDATE poller_endpoints SET event_types = '{}' "
                          "WHERE name = 'acme-audit'"))  # fmt: skip
    status, said = _send(web, "POST", f"/api/v1/events/{event_id}/replay", acme,
                         {"endpoint": "acme-audit"})  # fmt: skip
    assert status == 409 and "not subscribed" in str(said["detail"])
    with engine.connect() as conn:
        statuses = conn.execute(text(
            "SELECT e.name, o.status FROM poller_outbox o "
            "JOIN poller_endpoints e ON e.id = o.endpoint_id ORDER BY 1"
        )).all()  # fmt: skip
    assert [tuple(r) for r in statuses] == [("acme-audit", "failed"), ("acme-hooks", "pending")]


def test_a_tenant_makes_endpoints_up_to_its_limit_an_operator_past_it(engine: Engine) -> None:
    """Each endpoint multiplies a tenant's publishes inside the application's transaction,
    and a tenant's token made them without end: POLLER_TENANT_MAX_ENDPOINTS bounds it."""
    with engine.begin() as conn:
        create_endpoint(conn, "acme-1", "https://acme.example/1", tenant="acme")
        acme = tokens.create_token(conn, "acme", "tenant:acme")[1]
        admin = tokens.create_token(conn, "admin", "admin")[1]
    hooks = {"url": "https://acme.example/hooks"}
    with client(engine, tenant_max_endpoints=2) as web:
        assert _send(web, "POST", "/api/v1/endpoints", acme, hooks)[0] == 201
        status, problem = _send(web, "POST", "/api/v1/endpoints", acme, hooks)
        assert status == 409 and "has 2 endpoints" in str(problem["detail"])
        made = {"name": "acme-3", "tenant": "acme", **hooks}  # the operator may make more
        assert _send(web, "POST", "/api/v1/endpoints", admin, made)[0] == 201
    with client(engine, tenant_max_endpoints=0) as web:  # 0: no limit
        assert _send(web, "POST", "/api/v1/endpoints", acme, hooks)[0] == 201
    with engine.connect() as conn:
        held = "SELECT count(*) FROM poller_endpoints WHERE tenant = 'acme'"
        assert conn.execute(text(held)).scalar_one() == 4


def test_two_makes_at_once_cannot_both_pass_the_tenants_count(engine: Engine) -> None:
    """make_room holds the tenant's lock till its transaction ends: the second make waits
    for the first's commit, then counts it."""
    with engine.begin() as conn:
        create_endpoint(conn, "acme-1", "https://acme.example/1", tenant="acme")

    def second() -> None:
        with engine.begin() as conn:
            make_room(conn, "acme", 2)

    with ThreadPoolExecutor(1) as pool:
        with engine.begin() as conn:
            make_room(conn, "acme", 2)
            waiting = pool.submit(second)
            deadline = time.monotonic() + 30
            while not _lock_waits(engine):  # the second make waits on the lock
                assert time.monotonic() < deadline and not waiting.done(), "no wait on the lock"
                time.sleep(0.01)
            create_endpoint(conn, "acme-2", "https://acme.example/2", tenant="acme")
        with pytest.raises(TenantFull):
            waiting.result(timeout=30)


def test_an_operators_identity_is_operator_to_a_tenant(
    engine: Engine, api: tuple[TestClient, dict[str, str]]
) -> None:
    """The operator pauses, disables, cancels and sends a test event on acme's endpoint:
    acme's token sees "operator" where the operator's views name who (and so does acme's
    receiver, in the test event)."""
    web, made = api
    admin, acme = made["admin"], made["tenant:acme"]
    with Session(engine) as session, session.begin():
        (msg_id,) = enqueue_many(session, [Message("acme-hooks", "order.paid", {}, "k-1")])
    path = "/api/v1/endpoints/acme-hooks"
    assert _send(web, "POST", f"{path}/pause", admin)[0] == 200
    assert _send(web, "POST", f"/api/v1/messages/{msg_id}/cancel", admin)[0] == 200
    assert _send(web, "POST", f"{path}/test", admin)[0] == 202
    assert _send(web, "POST", f"{path}/disable", admin)[0] == 200
    theirs, ours = _send(web, "GET", path, acme)[1], _send(web, "GET", path, admin)[1]
    assert theirs["paused"]["by"] == "operator"  # type: ignore[index]
    assert theirs["disabled_reason"] == "disabled by operator"
    assert "token:admin" in str(ours["paused"]) and "token:admin" in str(ours["disabled_reason"])
    message = _send(web, "GET", f"/api/v1/messages/{msg_id}", acme)[1]
    assert message["last_error"] == "cancelled by operator"
    listed = _send(web, "GET", "/api/v1/messages?endpoint=acme-hooks", acme)[1]
    assert "admin" not in json.dumps(listed)
    with engine.connect() as conn:
        sent = conn.execute(text(
            "SELECT payload FROM poller_outbox WHERE event_type = 'webhook_poller.test'"
        )).scalar_one()  # fmt: skip
    assert sent["sent_by"] == "operator"


def test_a_private_url_is_refused_with_the_operators_hint_for_the_operator_alone(
    api: tuple[TestClient, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLLER_ALLOW_PRIVATE_TARGETS", "false")
    default_settings.cache_clear()
    web, made = api
    body = {"url": "http://10.0.0.1/hook"}
    status, said = _send(web, "POST", "/api/v1/endpoints", made["tenant:acme"], body)
    assert status == 422 and "private" in str(said["detail"])
    assert "POLLER_" not in str(said["detail"])  # a setting the customer cannot change
    status, said = _send(web, "POST", "/api/v1/endpoints", made["admin"], {"name": "in", **body})
    assert status == 422 and "POLLER_ALLOW_PRIVATE_TARGETS" in str(said["detail"])


def test_a_bug_is_a_500_with_an_id_in_the_log_never_a_client_error(
    engine: Engine,
    api: tuple[TestClient, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A ValueError a route did not expect is a bug: not the caller's 422."""
    from poller.web.api import endpoints as api_endpoints

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("a bug")

    monkeypatch.setattr(api_endpoints, "list_endpoints", broken)
    web, made = api
    with TestClient(
        web.app, base_url="http://127.0.0.1:8188", raise_server_exceptions=False
    ) as plain:
        answer = plain.get(
            "/api/v1/endpoints", headers={"Authorization": f"Bearer {made['admin']}"}
        )
    assert answer.status_code == 500 and "Traceback" not in answer.text
    error_id = answer.json()["detail"].rpartition(" ")[2]
    assert any(error_id in r.getMessage() and r.exc_info for r in caplog.records)
