"""The management API against values nobody should send, drawn by hypothesis: every
route, with nasty path segments, query strings and JSON bodies (each field of a create,
an update and a publish given a value of any JSON type, nested, huge or absurd). The
answer is a problem document below 500, never an exception (the test client re-raises
any that escape a route)."""

from __future__ import annotations

import itertools
import json
import os
import re
from typing import Any
from urllib.parse import quote, urlencode

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from poller.access import tokens
from poller.outbox.enqueue import enqueue
from poller.web.api.routes import OPERATIONS, routes
from tests.conftest import make_endpoint
from tests.integration.test_dashboard import client
from tests.integration.test_dashboard_fuzz import IDS, NAMES, NASTY

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), NASTY,
    st.just("a\ud800"),  # a lone surrogate, as JSON may escape one: jsonb refuses it
)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NASTY, inner, max_size=4),
    max_leaves=8,
)
FIELDS = sorted({f for op in OPERATIONS if op.spec.body for f in op.spec.body.__annotations__})
BODIES = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS) | NASTY, VALUES, max_size=6),
    VALUES,
)
TEMPLATES = sorted({(m, r.path) for r in routes() for m in (r.methods or ()) if m != "HEAD"})
QUERY = ["limit", "after", "status", "endpoint", "force", "event_type", "since", "until"]
_examples = itertools.count()
_token: dict[str, str] = {}


@settings(
    max_examples=150,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),  # CI: the same examples; elsewhere new ones
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    route=st.sampled_from(TEMPLATES),
    query=st.dictionaries(st.sampled_from(QUERY), NASTY, max_size=3),
    ident=st.just("1") | IDS,
    name=st.just("a") | NAMES,
    body=BODIES,
    scope=st.sampled_from(["admin", "tenant:acme"]),
    key=st.none() | NASTY,
)
def test_nasty_requests_get_a_problem_never_a_crash(
    engine: Engine, route: tuple[str, str], query: dict[str, str], ident: str, name: str,
    body: Any, scope: str, key: str | None,
) -> None:  # fmt: skip
    if next(_examples) == 0:  # the fixture's database lives as long as the whole test
        make_endpoint(engine, "a")  # no tenant's: acme's token must never reach it
        with engine.begin() as conn:
            for each in ("admin", "tenant:acme"):
                _token[each] = tokens.create_token(conn, each.replace(":", "-"), each)[1]
            _token["message"] = str(enqueue(conn, endpoint="a", event_type="e", payload={},
                                            idempotency_key="k"))  # fmt: skip
    method, template = route
    path = re.sub(r"{id}", ident, template)
    path = re.sub(r"{name(:path)?}", quote(name, safe="") or "%20", path)
    headers = {"Authorization": f"Bearer {_token[scope]}"}
    if key is not None and key.isascii() and "\n" not in key and "\r" not in key:
        headers["Idempotency-Key"] = key
    with client(engine, api_rate_limit=100_000) as web:
        if method != "GET" and body is not None:  # escaped as JSON may: lone surrogates too
            headers["Content-Type"] = "application/json"
            content = json.dumps(body).encode()
        else:
            content = None
        answer = web.request(
            method, f"{path}?{urlencode(query)}", content=content, headers=headers
        )  # fmt: skip
    assert answer.status_code < 500, (method, path, query, body, answer.text[:300])
    named = "{name}" in template and name == "a" and "event-types" not in template
    foreign = named or (
        "{id}" in template and "messages" in template and ident == _token["message"]
    )
    if scope == "tenant:acme" and foreign:
        # another tenant's: not found, or refused before it was looked for (no JSON, a bad
        # body); never done
        assert answer.status_code in (404, 413, 415, 422), (method, path, body, answer.text[:300])
    if answer.status_code >= 400:
        assert answer.headers["content-type"] == "application/problem+json", answer.text[:200]
