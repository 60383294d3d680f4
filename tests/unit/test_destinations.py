"""A broker URL (poller/rules/destinations.py, poller/endpoints/urls.py): every nasty
spelling is refused with InvalidEndpoint naming what is wrong, and nothing else."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poller.endpoints.urls import check_destination
from poller.errors import InvalidEndpoint

NASTY = [
    ("nats://h.example:0/a", "port 0"),
    ("nats://h.example:99999/a", "not a valid URL"),
    ("nats://h.example/", "names no subject"),
    ("nats://h.example/a..b", "not a subject"),
    ("nats://h.example/a.>", "not a subject"),
    ("nats://h.example/" + "a" * 300, "not a subject"),
    ("nats://h.example/a#frag", "fragment"),
    ("nats://h.example/a?x=1", "unknown parameter"),
    ("nats://:/a", "no host"),
    ("nats://h.example/a b", "spaces"),
    ("nats://h.example/a\x00", "control characters"),
    ("amqp://h.example/", "no exchange and no routing_key"),
    ("amqp://h.example/?exchange=a&exchange=b", "given 2 times"),
    ("amqp://h.example/?routing_key=%00", "printable"),
    ("amqp://h.example/%01?routing_key=q", "virtual host"),
    ("amqp://h.example/?routing_key=q&x", "malformed query"),
    ("redis://h.example/0", "needs ?stream"),
    ("redis://h.example/0?stream=", "needs ?stream"),
    ("redis://h.example/99999999?stream=s", "database must be a number"),
    ("redis://h.example/-1?stream=s", "database must be a number"),
    ("redis://h.example/0?stream=s&maxlen=0", "maxlen"),
    ("redis://h.example/0?stream=s&maxlen=1e9", "maxlen"),
    ("redis://h.example/0?stream=s&dedupe=1", "unknown parameter"),
    ("kafka://h.example/t", "must use one of"),
    ("nats://0x7f.1/a", "private"),
    ("rediss://[::ffff:10.0.0.1]/0?stream=s", "private"),
    ("amqp://u:p@ｌｏｃａｌｈｏｓｔ/?routing_key=q", "private"),
]


@pytest.mark.parametrize(("url", "said"), NASTY)
def test_a_nasty_broker_url_is_refused_saying_why(url: str, said: str) -> None:
    with pytest.raises(InvalidEndpoint, match=re.escape(said)):
        check_destination(url)


def test_credentials_come_apart_and_the_rest_is_stored() -> None:
    stored, userinfo = check_destination(
        "amqps://app:p%40ss@MQ.example:5671/prod?exchange=hooks&routing_key=k"
    )
    assert (stored, userinfo) == ("amqps://MQ.example:5671/prod?exchange=hooks&routing_key=k",
                                  "app:p%40ss")  # fmt: skip
    assert check_destination("nats://tok@n.example/a.b")[1] == "tok"


@given(st.text(max_size=80).map(lambda tail: "nats://n.example/" + tail))
def test_any_text_after_a_broker_scheme_is_stored_or_refused_as_invalid(url: str) -> None:
    with contextlib.suppress(InvalidEndpoint):
        check_destination(url)


@given(st.sampled_from(["amqp://", "redis://", "nats+tls://", "rediss://"]), st.text(max_size=60))
def test_any_authority_and_path_is_stored_or_refused_as_invalid(scheme: str, rest: str) -> None:
    with contextlib.suppress(InvalidEndpoint):
        check_destination(scheme + rest)
