"""The management API (poller/dashboard/api.py): tokens or the operator's credentials,
a tenant's token seeing its tenant alone (anything else 404, as for nothing), and every
failure a problem document."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from poller import tokens
from poller.endpoints import create_endpoint
from tests.integration.test_dashboard import TOKEN, client

PLANTED = "planted-api-credential-55"  # a header's value; with the secrets, never shown
SECRETS: list[str] = []
PROBLEM = "application/problem+json"


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


@pytest.mark.parametrize("limit", ["0", "501", "-1", "ten", "1e3"])
def test_a_bad_page_is_a_problem(api: tuple[TestClient, dict[str, str]], limit: str) -> None:
    web, made = api
    status, body, kind = _get(web, f"/api/v1/endpoints?limit={limit}", made["admin"])
    assert (status, kind, body["status"]) == (422, PROBLEM, 422) and "limit" in str(body["detail"])


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
    for _ in range(20):  # past the dashboard's throttle: 429, and the right token waits too
        web.get("/api/v1/endpoints", headers={"Authorization": "Bearer wpt_" + "x" * 43})
    answer = web.get("/api/v1/endpoints", headers={"Authorization": f"Bearer {made['admin']}"})
    assert answer.status_code == 429 and answer.headers["content-type"] == PROBLEM
