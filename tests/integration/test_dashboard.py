"""The dashboard's routes against a real PostgreSQL (Starlette's test client).

What they must never do matters as much as what they show: no page without
credentials, no change without the CSRF token and from another site, no
signing secret in any page, every value escaped.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from poller.errors import ConfigurationError
from poller.local.embedded import DASHBOARD_TOKEN_FILE, dashboard_token
from poller.outbox.enqueue import Message, enqueue_many
from poller.settings import load_settings
from poller.web import auth
from poller.web.app import create_app
from tests.conftest import make_endpoint

TOKEN = "t" * 12 + "-dashboard-token"
HOSTILE = "<script>alert('pwned')</script>"


def client(engine: Engine, *, peer: str = "testclient", **settings: Any) -> TestClient:
    creds = auth.Credentials(
        settings.pop("token", TOKEN), settings.pop("user", None), settings.pop("password", None)
    )
    app = create_app(load_settings(**settings), engine, creds)
    return TestClient(
        app, base_url="http://127.0.0.1:8188", follow_redirects=False, client=(peer, 50000)
    )


@pytest.fixture
def web(engine: Engine) -> Iterator[TestClient]:
    with client(engine) as c:
        login = c.get(f"/login?token={TOKEN}")
        assert login.status_code == 303
        yield c


def csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "no CSRF token in the page"
    return found.group(1)


def queue(
    engine: Engine, endpoint: str, n: int, prefix: str = "k", payload: Any = None
) -> list[int]:
    with engine.begin() as conn:
        return enqueue_many(
            conn,
            [
                Message(endpoint, "order.paid", payload or {"n": i}, f"{prefix}{i}")
                for i in range(n)
            ],
        )


def fail(
    engine: Engine, ids: list[int], *, code: int | None = 503, error: str = "HTTP 503"
) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE poller_outbox SET status = 'failed', attempts = max_attempts, "
                "failed_at = now() - make_interval(secs => id), last_status_code = :code, "
                "last_error = :error WHERE id = ANY(:ids)"
            ),
            {"ids": ids, "code": code, "error": error},
        )


def status_of(engine: Engine, message_id: int) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT status FROM poller_outbox WHERE id = :id"), {"id": message_id}
            ).scalar_one()
        )


# --- who may come in ----------------------------------------------------------------


def test_every_page_needs_credentials(engine: Engine) -> None:
    make_endpoint(engine)
    with client(engine) as c:
        for path in ("/", "/failed", "/messages/1", "/endpoints", "/leases", "/keys"):
            answer = c.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"].startswith("/login?next="), path
        assert c.get("/", headers={"Authorization": "Bearer wrong-token-wrong"}).status_code == 303
        assert c.post("/messages/1/retry").status_code == 401
        assert c.get(f"/login?token={TOKEN}x").status_code == 401
        assert c.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        forged = f"{auth.new_session(auth.Credentials('another-token-entirely'))}"
        c.cookies.set(auth.COOKIE, forged)
        assert c.get("/").status_code == 303


def test_login_goes_back_only_to_a_local_page(engine: Engine) -> None:
    with client(engine) as c:
        for target, expected in [
            ("/failed?endpoint=a", "/failed?endpoint=a"),
            ("https://evil.example/", "/"),
            ("//evil.example/", "/"),
            ("/\\evil.example", "/"),
            ("/\t/evil.example", "/"),  # browsers drop the tab: //evil.example
            ("/\n/evil.example", "/"),
        ]:
            answer = c.post("/login", data={"token": TOKEN, "next": target})
            assert answer.status_code == 303
            assert answer.headers["location"] == expected
            cookie = answer.headers["set-cookie"]
            assert "HttpOnly" in cookie and "SameSite=strict" in cookie


def test_basic_credentials(engine: Engine) -> None:
    with client(engine, token=None, user="ops", password="correct horse") as c:
        assert c.get("/").status_code == 401
        assert "Basic" in c.get("/").headers["www-authenticate"]
        good = base64.b64encode(b"ops:correct horse").decode()
        bad = base64.b64encode(b"ops:wrong").decode()
        assert c.get("/", headers={"Authorization": f"Basic {bad}"}).status_code == 401
        assert c.get("/", headers={"Authorization": "Basic %%%"}).status_code == 401
        page = c.get("/failed", headers={"Authorization": f"Basic {good}"})
        assert page.status_code == 200
        # Browsers send basic credentials by themselves: an action still needs the token.
        refused = c.post("/logout", headers={"Authorization": f"Basic {good}"})
        assert refused.status_code == 403


def test_guessing_is_throttled_and_sessions_outlive_it(engine: Engine) -> None:
    """Past ten wrong credentials a minute from one address, credentials from it are
    not even checked (429 with Retry-After); a session already issued still works."""
    with client(engine) as c:
        assert c.get(f"/login?token={TOKEN}").status_code == 303
        session = c.cookies[auth.COOKIE]
        c.cookies.clear()
        wrong = [
            lambda n: c.post("/login", data={"token": f"guess-{n:012d}"}),
            lambda n: c.get("/", headers={"Authorization": f"Bearer guess-{n:012d}"}),
        ]
        for n in range(auth.FAILURES_ALLOWED):
            assert wrong[n % 2](n).status_code in (401, 303)
        for attempt in (
            lambda: c.get("/", headers={"Authorization": f"Bearer {TOKEN}"}),  # even the right one
            lambda: c.post("/login", data={"token": "guess-again-guess"}),
        ):
            answer = attempt()
            assert answer.status_code == 429
            assert 1 <= int(answer.headers["retry-after"]) <= 60
        c.cookies.set(auth.COOKIE, session)
        assert c.get("/").status_code == 200  # a session is not a guess


def test_another_sites_page_cannot_lock_the_operator_out(engine: Engine) -> None:
    """A page the operator visits fires wrong login links as images, from the operator's
    address: only links are held up; the form, bearer and basic credentials still work."""
    image = {"sec-fetch-site": "cross-site", "sec-fetch-dest": "image"}
    with client(engine) as c:
        for n in range(3 * auth.FAILURES_ALLOWED):
            assert c.get(f"/login?token=guess-{n:012d}", headers=image).status_code in (401, 429)
        assert c.get(f"/login?token={TOKEN}").status_code == 429  # links: held up
        assert c.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert c.post("/login", data={"token": TOKEN}).status_code == 303
    with client(engine, token=None, user="ops", password="correct horse") as c:
        for n in range(3 * auth.FAILURES_ALLOWED):
            c.get(f"/login?token=guess-{n:012d}", headers=image)
        good = base64.b64encode(b"ops:correct horse").decode()
        assert c.get("/", headers={"Authorization": f"Basic {good}"}).status_code == 200


def test_served_on_loopback_it_answers_loopback_hosts_only(engine: Engine) -> None:
    """DNS rebinding: a page on evil.example re-pointed to 127.0.0.1 reaches the port as
    its own origin (its Origin matches its Host). On loopback, only loopback Hosts pass."""
    from poller.web.base import host_of

    assert [host_of(h) for h in ("[::1]:8188", "[::1]", "a.example:80", "a", "::1")] == [
        "[::1]", "[::1]", "a.example", "a", "::1",
    ]  # fmt: skip
    with client(engine) as c:
        for host in ("127.0.0.1:8188", "localhost:8188", "[::1]:8188", "127.0.0.2"):
            assert c.get("/login", headers={"host": host}).status_code == 200, host
        for host in ("evil.example:8188", "evil.example", "127.0.0.1.evil.example", ""):
            answer = c.get("/login", headers={"host": host})
            assert answer.status_code == 421, host
            assert answer.headers["x-frame-options"] == "DENY"
    with client(engine, dashboard_addr="0.0.0.0:8188") as c:  # behind a proxy: any name
        assert c.get("/login", headers={"host": "poller.internal.example"}).status_code == 200


def test_behind_a_trusted_proxy_each_client_is_throttled_on_its_own(engine: Engine) -> None:
    """POLLER_FORWARDED_ALLOW_IPS names the proxy: a guesser behind it is held up, the
    operator behind the same proxy is not; an untrusted peer's X-Forwarded-For is its
    own words, and changes nothing."""
    guesser, operator = {"x-forwarded-for": "203.0.113.7"}, {"x-forwarded-for": "198.51.100.9"}
    with client(engine, peer="10.0.0.5", forwarded_allow_ips=["10.0.0.0/24"]) as c:
        for n in range(auth.FAILURES_ALLOWED + 1):
            last = c.get("/", headers={"Authorization": f"Bearer guess-{n}", **guesser})
        assert last.status_code == 429
        right = {"Authorization": f"Bearer {TOKEN}"}
        assert c.get("/", headers={**right, **guesser}).status_code == 429
        assert c.get("/", headers={**right, **operator}).status_code == 200
    with client(engine, peer="192.0.2.1") as c:  # not a trusted proxy: its header is ignored
        for n in range(auth.FAILURES_ALLOWED + 1):
            spoofed = {"x-forwarded-for": f"198.51.100.{n}"}
            last = c.get("/", headers={"Authorization": f"Bearer guess-{n}", **spoofed})
        assert last.status_code == 429


def test_the_client_address_is_the_last_hop_a_trusted_proxy_did_not_add() -> None:
    trusted = auth.proxies(("10.0.0.0/8", "::1"))
    assert auth.client_address("10.1.2.3", "1.1.1.1, 203.0.113.7", trusted) == "203.0.113.7"
    assert auth.client_address("10.1.2.3", "203.0.113.7, 10.9.9.9", trusted) == "203.0.113.7"
    assert auth.client_address("192.0.2.1", "203.0.113.7", trusted) == "192.0.2.1"
    assert auth.client_address("::1", "garbage", trusted) == "::1"
    assert auth.client_address("10.1.2.3", "10.2.2.2", trusted) == "10.1.2.3"
    assert auth.client_address("10.1.2.3", None, ()) == "10.1.2.3"


def test_no_proxy_list_trusts_everyone() -> None:
    with pytest.raises(ConfigurationError, match="FORWARDED_ALLOW_IPS"):
        load_settings(forwarded_allow_ips=["*"])


def test_throttle_window_and_bounded_memory() -> None:
    throttle = auth.Throttle(allowed=3, window=10)
    for t in (0, 1, 2):
        assert throttle.wait("a", now=t) == 0
        throttle.failed("a", now=t)
    assert throttle.wait("a", now=3) == 7  # until the first failure leaves the window
    assert throttle.wait("b", now=3) == 0  # another address is not held up
    assert throttle.wait("a", now=10.5) == 0
    for n in range(auth.CLIENTS_TRACKED + 5):
        throttle.failed(f"10.0.{n // 256}.{n % 256}", now=20)
    assert len(throttle._failures) == auth.CLIENTS_TRACKED


def test_a_big_login_form_is_refused_unread(engine: Engine) -> None:
    with client(engine) as c:
        body = b"token=" + b"x" * (1 << 20)
        answer = c.post(
            "/login", content=body, headers={"content-type": "application/x-www-form-urlencoded"}
        )
        assert answer.status_code == 413


def test_credentials_from_settings_and_the_token_file(tmp_path: Path) -> None:
    made = auth.credentials(load_settings(data_dir=tmp_path))
    assert made.token_file == tmp_path / DASHBOARD_TOKEN_FILE
    assert made.token is not None and len(made.token) >= 16
    assert (made.token_file.stat().st_mode & 0o777) == 0o600
    assert auth.credentials(load_settings(data_dir=tmp_path)).token == made.token  # kept
    made.token_file.write_text("weak\n")  # a token too short to trust is replaced
    assert len(dashboard_token(made.token_file)) >= 16
    blocked = tmp_path / "blocked"
    (blocked / DASHBOARD_TOKEN_FILE).mkdir(parents=True)  # a folder where the file should be
    with pytest.raises(ConfigurationError, match="dashboard token"):
        auth.credentials(load_settings(data_dir=blocked))
    with pytest.raises(ConfigurationError, match="POLLER_DASHBOARD_TOKEN"):
        auth.credentials(load_settings(database_url="postgresql://x@127.0.0.1/db"))
    with pytest.raises(ConfigurationError, match="at least 16"):
        load_settings(dashboard_token="short")
    with pytest.raises(ConfigurationError, match="set both"):
        load_settings(dashboard_user="ops")
    from_env = auth.credentials(
        load_settings(dashboard_token=TOKEN, database_url="postgresql://x@h/d")
    )
    assert from_env.token == TOKEN and from_env.token_file is None


# --- what the pages show ---------------------------------------------------------------


def test_overview_shows_the_database_counts(engine: Engine, web: TestClient) -> None:
    make_endpoint(engine, "billing")
    make_endpoint(engine, "ledger")
    ids = queue(engine, "billing", 7)
    queue(engine, "ledger", 3)
    fail(engine, ids[:2])
    page = web.get("/")
    assert page.status_code == 200
    counts = dict(re.findall(r'data-status="(\w+)">([\d,]+)<', page.text))
    assert counts["pending"] == "8" and counts["failed"] == "2"
    assert 'data-endpoint="billing"' in page.text and 'data-endpoint="ledger"' in page.text
    assert "<svg" in page.text
    fragment = web.get("/", headers={"X-Poller-Refresh": "1"})
    assert fragment.status_code == 200 and "<html" not in fragment.text
    assert 'data-status="failed">2<' in fragment.text


def test_security_headers_on_every_answer(engine: Engine, web: TestClient) -> None:
    for path in ("/", "/static/dashboard.css", "/login"):
        headers = web.get(path).headers
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert "unsafe-inline" not in csp
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["cache-control"] == "no-store"


def test_hostile_values_are_shown_as_text(engine: Engine, web: TestClient) -> None:
    make_endpoint(engine, "billing")
    [mid] = queue(
        engine, "billing", 1, payload={"note": HOSTILE, "html": '<img src=x onerror="x()">'}
    )
    fail(engine, [mid], error=HOSTILE)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO poller_delivery_attempts (message_id, attempt, kind, poller_id, "
                "outcome, error_message, response_excerpt) VALUES (:id, 1, 'send', :who, "
                "'failed', :bad, :bad)"
            ),
            {"id": mid, "who": HOSTILE, "bad": HOSTILE},
        )
    for path in (f"/messages/{mid}", "/failed", f"/failed?error={HOSTILE}", "/"):
        page = web.get(path)
        assert page.status_code == 200, path
        assert "<script>alert" not in page.text and "<img src=x" not in page.text, path
    shown = web.get(f"/messages/{mid}").text
    assert "&lt;script&gt;alert(" in shown
    assert "&lt;img src=x onerror=" in shown
    deep = "[" * 3000 + "]" * 3000  # no value is made of it: written by SQL, or long ago
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE poller_outbox SET payload = CAST(:p AS json) WHERE id = :id"),
            {"p": deep, "id": mid},
        )
    page = web.get(f"/messages/{mid}")
    assert page.status_code == 200 and "[[[[" in page.text


def test_no_signing_secret_in_any_page(engine: Engine, web: TestClient) -> None:
    made = make_endpoint(engine, "billing")
    [mid] = queue(engine, "billing", 1)
    fail(engine, [mid])
    secret = made.secret
    core = secret.removeprefix("whsec_")
    for path in ("/", "/endpoints", "/failed", f"/messages/{mid}", "/endpoints/billing/disable"):
        page = web.get(path).text
        assert secret not in page and core not in page, path


def test_the_endpoint_page_shows_names_subjects_and_public_keys_never_values(
    engine: Engine, web: TestClient
) -> None:
    from poller.endpoints.registry import create_endpoint
    from poller.operate.cancel import pause_endpoint
    from tests.integration.pki import authority, issue

    ca = authority()
    mine = issue(ca, "billing", client=True)
    token = "Bearer planted-dashboard-credential"
    with engine.begin() as conn:
        created = create_endpoint(
            conn, "billing", "https://127.0.0.1:9/h", signing="ed25519",
            headers={"Authorization": token}, client_cert=mine.cert, client_key=mine.key,
            ca_bundle=ca.cert, retry_schedule=[5.0, 300.0], max_age=86400.0,
        )  # fmt: skip
        pause_endpoint(conn, "billing", who="ops:ann")
    page = web.get("/endpoints/billing")
    assert page.status_code == 200
    text = page.text
    (public,) = created.endpoint.public_keys
    for shown in (public, "Authorization", "CN=billing", "CN=Test Root CA", "5s, 300s", "86400s",
                  "by ops:ann", "ed25519"):  # fmt: skip
        assert shown in text, shown
    for hidden in ("planted-dashboard-credential", created.secret, "PRIVATE KEY",
                   mine.key.splitlines()[1]):  # fmt: skip
        assert hidden not in text
    listing = web.get("/endpoints").text
    assert 'href="/endpoints/billing"' in listing and "paused by ops:ann" in listing
    assert "planted" not in listing
    assert web.get("/endpoints/nope").status_code == 404
    assert web.get("/endpoints/%00").status_code == 404


def test_failed_pages_by_keyset(engine: Engine, web: TestClient) -> None:
    make_endpoint(engine, "billing")
    make_endpoint(engine, "ledger")
    ids = queue(engine, "billing", 120)
    fail(engine, ids)
    other = queue(engine, "ledger", 5)
    fail(engine, other, code=None, error="connection refused")
    seen: list[int] = []
    url = "/failed?endpoint=billing"
    pages = 0
    while url:
        page = web.get(url).text
        seen += [int(i) for i in re.findall(r'<tr data-id="(\d+)">', page)]
        found = re.search(r'rel="next" href="([^"]+)"', page)
        url = found.group(1).replace("&amp;", "&") if found else ""
        pages += 1
    assert pages == 3
    assert seen == sorted(ids)  # failed_at is older for higher ids: newest first is id order
    errors = web.get("/failed?error=REFUSED").text
    assert sorted(int(i) for i in re.findall(r'<tr data-id="(\d+)">', errors)) == other
    code = web.get("/failed?error=503&endpoint=ledger").text
    assert "No failed message matches" in code
    assert web.get("/failed?before=nonsense").status_code == 400
    assert web.get("/failed?since=yesterday-ish").status_code == 400
    assert web.get("/failed?endpoint=nobody").status_code == 404


def test_endpoints_page_by_name_and_filter(engine: Engine, web: TestClient) -> None:
    """A product's customers register thousands of endpoints: the page shows them 50 at
    a time by name, and those whose names contain a text."""
    names = [f"cust-{n:03}" for n in range(55)]
    for name in [*names, "ledger", "a_b", "axb"]:
        make_endpoint(engine, name)
    seen: list[str] = []
    url = "/endpoints?q=cust-"
    while url:
        page = web.get(url).text
        seen += re.findall(r'<tr data-endpoint="([^"]+)">', page)
        found = re.search(r'rel="next" href="([^"]+)"', page)
        url = found.group(1).replace("&amp;", "&") if found else ""
    assert seen == names
    first = web.get("/endpoints").text
    assert len(re.findall(r"<tr data-endpoint=", first)) == 50 and 'rel="next"' in first
    assert re.findall(r'<tr data-endpoint="([^"]+)">', web.get("/endpoints?q=a_b").text) == [
        "a_b"  # the text as it is: no wildcard
    ]
    assert "No endpoint matches" in web.get("/endpoints?q=nobody").text
    assert web.get("/endpoints?q=%00").status_code == 400
    assert web.get("/endpoints?after=%00").status_code == 400


# --- actions --------------------------------------------------------------------------


def test_retry_one_message(engine: Engine, web: TestClient) -> None:
    make_endpoint(engine, "billing")
    [mid] = queue(engine, "billing", 1)
    fail(engine, [mid])
    confirm = web.get(f"/messages/{mid}/retry")
    assert confirm.status_code == 200
    token = csrf(confirm.text)
    assert web.post(f"/messages/{mid}/retry", data={}).status_code == 403
    assert web.post(f"/messages/{mid}/retry", data={"csrf": "0" * 64}).status_code == 403
    cross = web.post(
        f"/messages/{mid}/retry", data={"csrf": token}, headers={"Origin": "https://evil.example"}
    )
    assert cross.status_code == 403
    sneaky = web.post(
        f"/messages/{mid}/retry", data={"csrf": token}, headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert sneaky.status_code == 403
    huge = web.post(f"/messages/{mid}/retry", data={"csrf": token, "pad": "x" * 70_000})
    streamed = web.post(
        f"/messages/{mid}/retry",
        content=iter([f"csrf={token}".encode()]),  # no length
    )
    assert huge.status_code == 413 and streamed.status_code == 413
    assert status_of(engine, mid) == "failed"
    done = web.post(f"/messages/{mid}/retry", data={"csrf": token})
    assert done.status_code == 303 and done.headers["location"].startswith(f"/messages/{mid}")
    assert status_of(engine, mid) == "pending"
    with engine.connect() as conn:
        who = conn.execute(
            text("SELECT poller_id FROM poller_delivery_attempts WHERE kind = 'manual'")
        ).scalar_one()
    assert who == "dashboard:token@testclient"
    again = web.post(f"/messages/{mid}/retry", data={"csrf": token})
    assert again.status_code == 409  # pending now: nothing to retry


def test_retry_a_filtered_set(engine: Engine, web: TestClient) -> None:
    make_endpoint(engine, "billing")
    make_endpoint(engine, "ledger")
    mine = queue(engine, "billing", 3)
    fail(engine, mine)
    theirs = queue(engine, "ledger", 2)
    fail(engine, theirs)
    confirm = web.get("/failed/retry?endpoint=billing&error=503")
    assert "<b>3</b> failed message(s)" in confirm.text
    done = web.post(
        "/failed/retry", data={"csrf": csrf(confirm.text), "endpoint": "billing", "error": "503"}
    )
    assert done.status_code == 303
    assert [status_of(engine, i) for i in mine] == ["pending"] * 3
    assert [status_of(engine, i) for i in theirs] == ["failed"] * 2


def test_disable_enable_and_replay_an_endpoint(engine: Engine, web: TestClient) -> None:
    make_endpoint(engine, "billing")
    token = csrf(web.get("/endpoints/billing/disable").text)
    assert web.post("/endpoints/billing/disable", data={"csrf": token}).status_code == 303
    with engine.connect() as conn:
        enabled, reason = conn.execute(
            text("SELECT enabled, disabled_reason FROM poller_endpoints WHERE name = 'billing'")
        ).one()
    assert not enabled and reason == "disabled by dashboard:token@testclient"
    assert web.post("/endpoints/billing/enable", data={"csrf": token}).status_code == 303
    assert web.post("/endpoints/nobody/enable", data={"csrf": token}).status_code == 404
    assert web.post("/endpoints/billing/explode", data={"csrf": token}).status_code == 404
    preview = web.get("/endpoints/billing/replay?since=1h")
    assert preview.status_code == 200 and "<b>0</b> event(s)" in preview.text
    replayed = web.post("/endpoints/billing/replay", data={"csrf": token, "since": "1h"})
    assert replayed.status_code == 303
    assert web.post("/endpoints/billing/replay", data={"csrf": token}).status_code == 400
    assert "health, attempts and circuit are left alone" in web.get("/endpoints/billing/pause").text
    assert web.post("/endpoints/billing/pause", data={"csrf": token}).status_code == 303
    listing = web.get("/endpoints").text
    assert "paused by dashboard:token@testclient" in listing and "/billing/resume" in listing
    assert web.post("/endpoints/billing/resume", data={"csrf": token}).status_code == 303
    assert "/billing/pause" in web.get("/endpoints").text
    assert web.post("/endpoints/nobody/pause", data={"csrf": token}).status_code == 404


def test_read_only_changes_nothing(engine: Engine) -> None:
    make_endpoint(engine, "billing")
    [mid] = queue(engine, "billing", 1)
    fail(engine, [mid])
    with client(engine, dashboard_read_only=True) as c:
        c.get(f"/login?token={TOKEN}")
        page = c.get(f"/messages/{mid}").text
        assert "read-only" in page and f"/messages/{mid}/retry" not in page
        token = csrf(page)  # the log-out form's
        assert c.post(f"/messages/{mid}/retry", data={"csrf": token}).status_code == 403
        assert c.post("/endpoints/billing/disable", data={"csrf": token}).status_code == 403
    assert status_of(engine, mid) == "failed"


def test_pages_that_have_nothing_to_show(engine: Engine, web: TestClient) -> None:
    for path in ("/", "/failed", "/endpoints", "/leases", "/keys"):
        assert web.get(path).status_code == 200, path
    assert web.get("/messages/999999").status_code == 404
    assert web.get("/messages/not-a-number").status_code == 404


@pytest.mark.parametrize("huge", ["99999999999999999999", "7" * 5000], ids=["bigint", "4300"])
def test_values_no_row_can_have_are_not_found_not_errors(
    engine: Engine, web: TestClient, huge: str
) -> None:
    """Past bigint PostgreSQL would refuse an id, not answer; past 4,300 digits Python's
    int() raises (a 500 from the route's int converter)."""
    assert web.get(f"/messages/{huge}").status_code == 404
    assert web.get(f"/messages/{huge}/retry").status_code == 404
    assert web.get(f"/failed?before=2026-01-01T00:00:00%2B00:00~{huge}").status_code == 400
    assert web.get("/failed?endpoint=" + "x" * 201).status_code == 400
    assert web.get("/failed?error=%25_%5C").status_code == 200  # LIKE's own characters
    assert web.get("/endpoints/%00/disable").status_code == 200  # a confirmation, no change
    token = csrf(web.get("/endpoints/x/disable").text)
    assert web.post("/endpoints/%00/disable", data={"csrf": token}).status_code == 404
    make_endpoint(engine, "a")  # found by the fuzz test: a NUL reached PostgreSQL (500)
    assert web.get("/endpoints/a/replay?since=5m&event_type=%00").status_code == 400
    assert (
        web.post(
            "/endpoints/a/replay", data={"csrf": token, "since": "5m", "event_type": "a\x00"}
        ).status_code
        == 400
    )


def test_a_database_that_is_away_is_a_503_page(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    from poller.store.db import sync_engine
    from tests.integration.servers import free_closed_port

    port = free_closed_port().rsplit(":", 1)[1]
    away = sync_engine(f"postgresql://poller:secret-password@127.0.0.1:{port}/db")
    with client(away) as c, caplog.at_level("WARNING", logger="poller.dashboard"):
        page = c.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert page.status_code == 503 and "not answering" in page.text
    assert "Traceback" not in page.text and "secret-password" not in page.text + caplog.text
    assert any("database unavailable" in r.getMessage() for r in caplog.records)


def test_an_expected_failure_no_page_handles_is_a_status_page(
    web: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every face maps the error tree once: a NotFound escaping a page is a 404 page, any
    other PollerError a 400, never a 500 with a traceback."""
    from poller.errors import InvalidInput, NothingMatched
    from poller.operate import admin

    def raises(exc: Exception) -> Any:
        def detail(*args: object, **kwargs: object) -> None:
            raise exc

        return detail

    monkeypatch.setattr(admin, "message_detail", raises(NothingMatched("nothing matched: x")))
    page = web.get("/messages/1")
    assert page.status_code == 404 and "nothing matched: x" in page.text
    monkeypatch.setattr(admin, "message_detail", raises(InvalidInput("'x' is not a message id")))
    page = web.get("/messages/1")
    assert page.status_code == 400 and "is not a message id" in page.text
