"""The tenant portal against values nobody should send, drawn by hypothesis: every page
and form of acme's session with nasty path segments and form fields. The answer is a
page below 500 (a 503 only while the database is away), never a traceback, never a
secret of another endpoint; acme's session changes nothing of another tenant's."""

from __future__ import annotations

import os
import re
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from poller.endpoints.registry import create_endpoint
from tests.integration.test_dashboard import client
from tests.integration.test_dashboard_fuzz import NASTY
from tests.integration.test_portal import KEY, _open

ROUTES = (
    ("GET", "/portal/"),
    ("GET", "/portal/endpoints/{name}"),
    ("GET", "/portal/messages/{id}"),
    ("POST", "/portal/endpoints"),
    ("POST", "/portal/endpoints/{name}/{verb}"),
    ("POST", "/portal/messages/{id}/retry"),
    ("GET", "/portal/start"),
)
VERBS = st.sampled_from(["rotate", "enable", "disable", "test", "replay"]) | NASTY
FIELDS = st.dictionaries(
    st.sampled_from(["url", "event_types", "payload_filter", "since", "csrf"]) | NASTY,
    NASTY,
    max_size=4,
)


STRATEGIES = dict(
    route=st.sampled_from(ROUTES),
    name=st.sampled_from(["acme-hooks", "globex-hooks"]) | NASTY,
    ident=st.sampled_from(["1", "2", "-1", "0", "9" * 30, "7" * 5000]) | NASTY,
    verb=VERBS,
    fields=FIELDS,
    with_csrf=st.booleans(),
)


def test_nasty_portal_requests_get_a_page_never_a_crash(engine: Engine) -> None:
    with engine.begin() as conn:
        create_endpoint(conn, "acme-hooks", "https://acme.example/in", tenant="acme",
                        headers={"X-Key": "planted-portal-value-77"})  # fmt: skip
        theirs = create_endpoint(conn, "globex-hooks", "https://globex.example/in",
                                 tenant="globex").secret  # fmt: skip
    # One app and one session for every example: making each costs ~0.4 s.
    with client(engine, portal_key=KEY, api_rate_limit=100_000) as web:
        token = _open(web, "acme")

        @settings(max_examples=120, deadline=None, derandomize=bool(os.environ.get("CI")),
                  suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
        @given(**STRATEGIES)
        def example(route: tuple[str, str], name: str, ident: str, verb: str,
                    fields: dict[str, str], with_csrf: bool) -> None:  # fmt: skip
            method, template = route
            path = (template.replace("{name}", quote(name, safe="") or "%20")
                    .replace("{id}", quote(ident, safe="") or "%20")
                    .replace("{verb}", quote(verb, safe="") or "%20"))  # fmt: skip
            data = {**fields, **({"csrf": token} if with_csrf else {})}
            answer = web.request(method, path, data=data if method == "POST" else None)
            assert answer.status_code < 500 or answer.status_code == 503, (
                method, path, answer.text[:300])  # fmt: skip
            assert "Traceback" not in answer.text
            assert theirs not in answer.text and "planted-portal-value-77" not in answer.text
            if answer.status_code == 201:  # a create: its own secret, shown once
                assert len(re.findall(r"whsec_", answer.text)) == 1

        example()


def test_another_tenants_endpoint_is_out_of_an_acme_sessions_reach(engine: Engine) -> None:
    """Each change an acme session may try, on globex's endpoint: 404, and nothing
    changed."""
    with engine.begin() as conn:
        create_endpoint(conn, "globex-hooks", "https://globex.example/in", tenant="globex")
    with client(engine, portal_key=KEY) as web:
        token = _open(web, "acme")
        for verb in ("disable", "rotate", "test", "replay"):
            answer = web.post(f"/portal/endpoints/globex-hooks/{verb}", data={"csrf": token})
            assert answer.status_code == 404
    with engine.connect() as conn:
        query = ("SELECT enabled, updated_at = created_at AS same FROM poller_endpoints "
                 "WHERE name = 'globex-hooks'")  # fmt: skip
        row = conn.execute(text(query)).one()
        count = conn.execute(text("SELECT count(*) FROM poller_outbox")).scalar_one()
    assert row.enabled and row.same and count == 0
