"""Enqueue input validation (pure: nothing touches a database)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poller import InvalidIdempotencyKey, InvalidPayload, Message, PayloadTooLarge
from poller.endpoints.netguard import host_refusal
from poller.endpoints.registry import bucket_for, new_secret
from poller.endpoints.urls import check_url
from poller.errors import InvalidEndpoint, PrivateTarget
from poller.outbox.enqueue import check_message
from poller.redact import scrub_urls, shown_url
from poller.rules.payloads import serialise_payload

visible_ascii = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=255
)


@given(visible_ascii.filter(lambda k: k not in (".", "..")))  # dot segments: refused
def test_every_visible_ascii_key_up_to_255_is_accepted(key: str) -> None:
    assert check_message(Message("e", "t", {}, key), 1024).idempotency_key == key


@given(
    st.text(min_size=1, max_size=300).filter(
        lambda k: len(k) > 255 or any(not 0x21 <= ord(c) <= 0x7E for c in k)
    )
)
def test_other_keys_are_refused(key: str) -> None:
    with pytest.raises(InvalidIdempotencyKey):
        check_message(Message("e", "t", {}, key), 1024)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=20,
    )
)
def test_json_payloads_serialise_or_fail_with_invalid_payload(payload: object) -> None:
    try:
        body = serialise_payload({"v": payload}, 1 << 20)
    except InvalidPayload:
        return  # NUL characters or lone surrogates
    assert "\\u0000" not in body.replace("\\\\", "")


def test_escaped_backslash_before_u0000_text_is_fine() -> None:
    assert serialise_payload({"v": "\\u0000"}, 100) == '{"v":"\\\\u0000"}'


def test_size_limit_counts_utf8_bytes() -> None:
    serialise_payload({"v": "é" * 4}, 16)  # 8 bytes + 8 for {"v":""}
    with pytest.raises(PayloadTooLarge):
        serialise_payload({"v": "é" * 5}, 16)


def test_buckets_are_stable_and_in_range() -> None:
    assert bucket_for("billing") == bucket_for("billing")
    assert bucket_for("billing") == 12  # pinned: changing it would move every shard
    assert {bucket_for(f"e{i}") for i in range(5000)} == set(range(256))


def test_secrets_are_standard_webhooks_secrets() -> None:
    import base64

    secret = new_secret()
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 24
    assert new_secret() != secret


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://x.example",
        "http://",
        "https://user:pw@x.example/",
        "http://x.example:0/",
        "http://exa mple.com/",
        "not a url",
        "http://x.example:99999/",
        "http://xn--zz/",  # an A-label that is not valid punycode: clients cannot encode it
        "http://1.2.3.256/",  # numeric, but no address
        "http://1.2.3.4.5/",
        "http://09.1.1.1/",  # 09 is not octal
        "http://[::1/",
        "http://-bad-.example/",
        "https://x.example/" + "a" * 8175,  # 8,193 characters: servers refuse the request line
        "https://x.example/\ud800",  # a lone surrogate: was a UnicodeEncodeError
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidEndpoint) as refused:
        check_url(url, allow_private=True)
    assert len(str(refused.value)) < 300  # the URL is not echoed whole


def test_a_url_of_8192_characters_is_taken() -> None:
    url = "https://x.example/" + "a" * 8174
    assert len(url) == 8192 and check_url(url) == url


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "10.1.2.3",
        "192.168.0.1",
        "169.254.169.254",
        "[::1]",
        "localhost",
        "api.localhost",
        "0.0.0.0",
        "[fc00::1]",
        "2130706433",
        "0177.0.0.1",
        "0x7f.1",
        "127.1",
        "017700000001",
        "127.0.0.1.",
        "[::ffff:127.0.0.1]",
        "[64:ff9b::a01:203]",  # NAT64 of 10.1.2.3
        "[2002:c0a8:1::]",  # 6to4 of 192.168.0.1
        "100.64.0.1",
        "224.0.0.1",
    ],
)
def test_private_hosts_are_refused_unless_allowed(host: str) -> None:
    """Refused with the words a tenant may read; the setting that allows it is the
    operator's hint, apart (the CLI and an admin's API call add it)."""
    assert host_refusal(host.strip("[]"))
    with pytest.raises(PrivateTarget, match="private") as refused:
        check_url(f"http://{host}/hook")
    assert "POLLER_ALLOW" not in str(refused.value) and "POLLER_ALLOW" in refused.value.hint
    assert check_url(f"http://{host}/hook", allow_private=True)


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("https://１２７.０.０.１/in", "https://127.0.0.1/in"),
        ("https://127。0。0。1:8443/in", "https://127.0.0.1:8443/in"),
        ("https://ｌｏｃａｌｈｏｓｔ/in", "https://localhost/in"),
        ("https://bücher.example/in", "https://xn--bcher-kva.example/in"),
        ("https://ＨＯＯＫＳ.example/in", "https://hooks.example/in"),
    ],
)
def test_look_alike_hosts_are_stored_as_the_host_a_client_connects_to(
    given: str, stored: str
) -> None:
    """IDNA's mapping at create: what is stored, checked and shown is the ASCII host (a
    full-width 127.0.0.1 used to be stored as typed, and refused only at connect)."""
    assert check_url(given, allow_private=True) == stored
    if "xn--" not in stored and "hooks" not in stored:
        with pytest.raises(PrivateTarget):
            check_url(given)


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("http://2130706433:8080/hook", "http://127.0.0.1:8080/hook"),
        ("http://0177.0.0.1/hook", "http://127.0.0.1/hook"),
        ("http://0x7f.1/", "http://127.0.0.1/"),
        ("http://127.1/", "http://127.0.0.1/"),
        ("http://[0:0:0:0:0:ffff:7f00:1]/", "http://[::ffff:7f00:1]/"),
        ("http://127.0.0.1:9/x", "http://127.0.0.1:9/x"),
        ("https://Hooks.Example.com/in", "https://Hooks.Example.com/in"),
    ],
)
def test_numeric_hosts_are_stored_in_their_canonical_spelling(given: str, stored: str) -> None:
    assert check_url(given, allow_private=True) == stored


def test_public_hosts_pass() -> None:
    assert host_refusal("8.8.8.8") is None
    assert check_url("https://hooks.example.com/in?x=1")
    assert check_url("https://bücher.example/in") == "https://xn--bcher-kva.example/in"
    assert check_url("https://_dmarc.example.com/in")


def test_the_error_tree_drawn_in_errors_py_is_the_classes() -> None:
    """poller/errors.py draws its tree in its docstring; it must stay the real one."""
    import inspect
    import re

    from poller import errors

    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.PollerError)
    ]
    drawn = []
    for line in (errors.__doc__ or "").splitlines():
        found = re.match(r"    ([│├└─ ]*)([A-Za-z]+)", line)
        if found and found.group(2)[0].isupper() and found.group(2) in vars(errors):
            drawn.append((len(found.group(1)) // 4, found.group(2)))

    def walk(node: type, depth: int) -> list[tuple[int, str]]:
        children = sorted((c for c in classes if c.__bases__[0] is node), key=lambda c: c.__name__)
        return [(depth, node.__name__)] + [x for c in children for x in walk(c, depth + 1)]

    assert drawn == walk(errors.PollerError, 0), inspect.getdoc(errors)


@pytest.mark.parametrize(
    ("reader", "value", "message"),
    [
        ("duration", "0s", "not a duration"),
        ("duration", "7 fortnights", "not a duration"),
        ("duration", "1e400", "not a duration"),
        ("duration", "99999999999d", "longer than 100 years"),
        ("duration", "36526d", "longer than 100 years"),  # --keep-old-for 3000000d: exit 70
        ("moment", "yesterday", "neither a duration"),
        ("moment", "99999999999d", "longer than 100 years"),
        # the year 10000 in UTC: PostgreSQL stored it, and nothing could read it back
        ("moment", "9999-12-31T23:59:59-14:00", "outside the years 1 to 9999 in UTC"),
        ("moment", "0001-01-01T00:00:00+14:00", "outside the years 1 to 9999 in UTC"),
        ("deadline", "9999-12-31T23:59:59-14:00", "outside the years 1 to 9999 in UTC"),
        ("row_id", "abc", "is not a message id"),
        ("row_id", "-1", "is not a message id"),
        ("row_id", "٣", "is not a message id"),  # a digit, but not an ASCII one
        ("row_id", str(2**63), "from 1 to"),
        ("row_id", "0", "from 1 to"),
        ("json_payload", "{", "is not JSON"),
        ("json_payload", '{"a": NaN}', "NaN is not a JSON number"),  # Python reads it
        ("json_payload", '{"a": [Infinity]}', "Infinity is not a JSON number"),
        ("json_payload", '{"a": 1e999999}', "beyond the range"),  # jsonb refuses it
        ("json_payload", '{"a": ' + "9" * 5000 + "}", "an integer of 5000 digits"),
        ("json_payload", "[" * 100_000, "is not JSON"),  # too deep: refused, not a crash
    ],
)  # fmt: skip
def test_what_people_type_is_refused_with_what_was_expected(
    reader: str, value: str, message: str
) -> None:
    """poller/rules/parse.py reads for every face: the nastiest values are a typed error."""
    from poller.errors import PollerError
    from poller.rules import parse

    with pytest.raises(PollerError, match=message):
        getattr(parse, reader)(value)


def test_what_people_type_is_read() -> None:
    from datetime import UTC, datetime, timedelta

    from poller.rules import parse

    now = datetime(2026, 12, 1, tzinfo=UTC)
    assert parse.duration("90s") == timedelta(seconds=90) == parse.duration(" 1.5m ")
    assert parse.moment("1h", now) == now - timedelta(hours=1)
    assert parse.moment("2026-11-30T09:00:00") == datetime(2026, 11, 30, 9, tzinfo=UTC)
    east = parse.moment("2026-11-30T09:00:00+14:00")
    assert east.tzinfo is UTC and east == datetime(2026, 11, 29, 19, tzinfo=UTC)
    assert parse.row_id(" 42 ") == 42 == parse.row_id(42)
    assert parse.json_payload('{"a": 1}').text == '{"a": 1}'


def test_an_endless_list_of_event_types_is_refused_at_its_101st() -> None:
    """Counted as they come: 100,000 patterns took 100 s to refuse (a quadratic de-dupe)."""
    import itertools

    from poller.endpoints.subscriptions import check_patterns
    from poller.errors import InvalidSubscription

    with pytest.raises(InvalidSubscription, match="at most 100"):
        check_patterns(f"t{n}" for n in itertools.count())
    assert check_patterns(["a", "b*", "a", "*"]) == ["a", "b*", "*"]


def test_an_endpoint_timeout_has_the_settings_floor() -> None:
    """1e-300 was taken: every request to the endpoint timed out at once."""
    from poller.endpoints.checks import check_timeout

    with pytest.raises(InvalidEndpoint, match=r"at least 0\.05 s"):
        check_timeout(1e-300)
    assert check_timeout(0.05) == 0.05 and check_timeout(None) is None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://hooks.slack.com/services/T0/B0/SECRET", "https://hooks.slack.com/…"),
        ("https://u:p@h.example:8443/a?token=SECRET", "https://h.example:8443/…"),
        ("http://[::1]:9/x", "http://[::1]:9/…"),
        ("https://h.example", "https://h.example"),
        ("https://h.example/", "https://h.example"),
        ("https://h.example?k=SECRET", "https://h.example/…"),
        ("https://h.example:99999/SECRET", "https://…"),
    ],
)
def test_a_url_is_shown_without_path_query_or_credentials(url: str, shown: str) -> None:
    assert shown_url(url) == shown
    said = scrub_urls(f"ClientError: 502, message='Bad Gateway', url='{url}' (again: {url})")
    assert "SECRET" not in said and "u:p" not in said and said.count(shown) == 2
