"""The dashboard against values nobody should send, drawn by hypothesis.

Every route, logged in, with nasty query strings, path segments and form fields
(NULs, bidi controls, numbers past bigint, dates past year 9999, cursors of the
wrong shape, strings of 10,000 characters, invalid UTF-8 percent escapes): the answer is a
page with a status below 500 — an error a person can read — and never an
exception (the test client re-raises any that escape a route).
"""

from __future__ import annotations

import itertools
import os
from urllib.parse import quote, urlencode

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from tests.conftest import make_endpoint
from tests.integration.test_dashboard import TOKEN, client, csrf, fail, queue

NASTY = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "a\x00b",
            "\u202e",
            "%",
            "%ff",
            "'; DROP TABLE poller_outbox; --",
            "<script>alert(1)</script>",
            "9" * 30,
            "7" * 5000,  # int() of more than 4,300 digits raises
            "-1",
            "0",
            "503",
            "nan",
            "inf",
            "1e308",
            "now",
            "5m",
            "7d",
            "-5m",
            "99999999999999d",
            "2026-13-45",
            "9999-12-31T23:59:59",
            "0001-01-01T00:00:00+00:00",
            "2026-01-01T00:00:00~1",
            "2026-01-01T00:00:00+00:00~99999999999999999999",
            "2026-01-01T00:00:00+14:00~-3",
            "~",
            "x" * 10_000,
        ]
    ),
    st.text(max_size=40),
)
PARAMS = ("endpoint", "event_type", "error", "since", "until", "before", "done", "n")
GET_PATHS = (
    "/",
    "/failed",
    "/failed/retry",
    "/messages/{id}",
    "/messages/{id}/retry",
    "/endpoints",
    "/endpoints/{name}/enable",
    "/endpoints/{name}/disable",
    "/endpoints/{name}/replay",
    "/leases",
    "/keys",
)
POST_PATHS = (
    "/failed/retry",
    "/messages/{id}/retry",
    "/endpoints/{name}/enable",
    "/endpoints/{name}/disable",
    "/endpoints/{name}/replay",
)
IDS = st.one_of(st.sampled_from(["1", "0", "9" * 19, "9" * 40]), st.integers(0, 2**63).map(str))
NAMES = st.one_of(st.sampled_from(["a", "nope", "a%00", "%2e%2e", "x" * 500]), NASTY)


_examples = itertools.count()


def _path(template: str, ident: str, name: str) -> str:
    return template.format(id=ident, name=quote(name, safe="") or "%20")


@settings(
    max_examples=100,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),  # CI: the same examples; elsewhere new ones
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    get=st.sampled_from(GET_PATHS),
    post=st.none() | st.sampled_from(POST_PATHS),
    query=st.dictionaries(st.sampled_from(PARAMS), NASTY, max_size=4),
    ident=IDS,
    name=NAMES,
)
def test_nasty_requests_get_a_page_never_a_crash(
    engine: Engine, get: str, post: str | None, query: dict[str, str], ident: str, name: str
) -> None:
    if next(_examples) == 0:  # the fixture's database lives as long as the whole test
        make_endpoint(engine, "a")
        fail(engine, queue(engine, "a", 3))
    with client(engine) as web:
        assert web.get(f"/login?token={TOKEN}").status_code == 303
        path = _path(get, ident, name)
        answer = web.get(f"{path}?{urlencode(query)}")
        assert answer.status_code < 500, (path, query, answer.text[:300])
        assert "Traceback" not in answer.text
        if post is not None:
            token = csrf(web.get("/failed").text)
            target = _path(post, ident, name)
            answer = web.post(target, data={**query, "csrf": token})
            assert answer.status_code < 500, (target, query, answer.text[:300])
            assert "Traceback" not in answer.text
