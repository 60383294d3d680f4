"""Deliveries through an egress proxy (poller/deliver/proxy.py), through both HTTP clients: the
proxy is asked for the checked address, never a name; a private target is refused before
the proxy sees a byte; every proxy failure is classified and names the proxy, never its
password."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loadtest.forward_proxy import ForwardProxy
from poller.deliver.delivery import send
from poller.deliver.wire import Sender
from poller.errors import ConfigurationError
from poller.local.receiver import Receiver
from poller.rules.outcomes import Verdict
from poller.settings import Proxy, load_settings, parse_proxy
from tests.integration import senders
from tests.integration.pki import authority, issue, tls_server
from tests.integration.test_delivery import _endpoint, _message

PASSWORD = "s3cret-proxy-pw"  # must never appear in an error


def _resolve(answers: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    async def resolve(host: str, port: int) -> list[str]:
        if host in answers:
            return answers[host]
        raise OSError(f"{host} does not resolve here")

    return resolve


ANSWERS = {
    "127.0.0.1": ["127.0.0.1"],
    "localhost": ["127.0.0.1"],
    "receiver.example": ["8.8.8.8"],  # global: the guard passes it; the proxy maps it here
    "internal.example": ["10.1.2.3"],
    "mixed.example": ["10.9.9.9", "8.8.4.4"],
}


@pytest.fixture(params=senders.KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _sender(kind: str, proxy: Proxy, *, allow_private: bool) -> Sender:
    return senders.make(kind, proxy=proxy, allow_private=allow_private, resolve=_resolve(ANSWERS))


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, int]]:
    got = Receiver()
    port = await got.start()
    yield got, port
    await got.stop()


async def _through(
    kind: str, forward: ForwardProxy, url: str, *, allow_private: bool = True, **tls: str
):  # type: ignore[no-untyped-def]
    address = await forward.start()
    host, port = address.rsplit(":", 1)
    sender = _sender(kind, Proxy(host, int(port), "egress", PASSWORD), allow_private=allow_private)
    try:
        endpoint = dataclasses.replace(_endpoint(url), **tls)
        return await send(sender, endpoint, _message(), timeout=2, user_agent="t")
    finally:
        await sender.aclose()
        await forward.stop()


async def test_an_http_target_is_asked_for_by_its_checked_address(
    kind: str, receiver: tuple[Receiver, int]
) -> None:
    got, port = receiver
    forward = ForwardProxy(credentials=("egress", PASSWORD))
    attempt = await _through(kind, forward, f"http://localhost:{port}/hook")
    assert attempt.verdict is Verdict.DELIVERED, attempt
    assert forward.asked == [f"POST http://127.0.0.1:{port}/hook"]  # the address, not the name
    assert got.stats.per_path["/hook"] == 1


async def test_an_https_target_is_tunnelled_to_its_address_and_verified_by_name(
    kind: str, tmp_path: Path
) -> None:
    ca = authority()
    async with tls_server(tmp_path, issue(ca, "localhost")) as url:
        port = url.rsplit(":", 1)[1]
        forward = ForwardProxy(credentials=("egress", PASSWORD))
        attempt = await _through(kind, forward, f"https://localhost:{port}/hook", ca_bundle=ca.cert)
    assert attempt.verdict is Verdict.DELIVERED, attempt
    assert forward.asked == [f"CONNECT 127.0.0.1:{port}"]


async def test_a_global_target_goes_through_while_the_guard_holds(
    kind: str, receiver: tuple[Receiver, int]
) -> None:
    """Private targets refused: the proxy (on 127.0.0.1) is the one address a socket may
    reach; a target resolving to a global address is sent through it, by that address."""
    got, port = receiver
    forward = ForwardProxy(credentials=("egress", PASSWORD), upstream=("127.0.0.1", port))
    attempt = await _through(kind, forward, "http://receiver.example/hook", allow_private=False)
    assert attempt.verdict is Verdict.DELIVERED, attempt
    assert forward.asked == ["POST http://8.8.8.8/hook"]
    assert got.stats.per_path["/hook"] == 1


@pytest.mark.parametrize(
    "url", ["http://internal.example/hook", "http://10.0.0.1/hook", "https://127.0.0.1:9/h"]
)
async def test_a_private_target_is_refused_before_the_proxy_sees_a_byte(
    kind: str, url: str
) -> None:
    forward = ForwardProxy(credentials=("egress", PASSWORD))
    attempt = await _through(kind, forward, url, allow_private=False)
    assert attempt.verdict is Verdict.RETRY and attempt.error_class == "ConnectError", attempt
    assert "refused" in attempt.error_message and forward.connections == 0


async def test_a_mixed_answer_uses_only_the_global_address(
    kind: str, receiver: tuple[Receiver, int]
) -> None:
    _, port = receiver
    forward = ForwardProxy(upstream=("127.0.0.1", port), credentials=("egress", PASSWORD))
    attempt = await _through(kind, forward, "http://mixed.example/hook", allow_private=False)
    assert attempt.verdict is Verdict.DELIVERED and forward.asked == ["POST http://8.8.4.4/hook"]


@pytest.mark.parametrize(
    ("forward", "scheme", "verdict", "said"),
    [
        (ForwardProxy(credentials=("egress", "other")), "http", Verdict.RETRY, "answered 407"),
        (ForwardProxy(credentials=("egress", "other")), "https", Verdict.RETRY, "answered 407"),
        (ForwardProxy(mode="refuse_tunnel"), "https", Verdict.RETRY, "answered 502"),
        (ForwardProxy(mode="hang"), "https", Verdict.RETRY, "proxy"),
        (ForwardProxy(mode="bad_gateway"), "http", Verdict.UNKNOWN, "may have the request"),
    ],
    ids=["407-http", "407-connect", "502-connect", "hang-connect", "502-absolute"],
)
async def test_proxy_failures_are_classified_and_name_the_proxy(
    kind: str, forward: ForwardProxy, scheme: str, verdict: Verdict, said: str
) -> None:
    attempt = await _through(kind, forward, f"{scheme}://127.0.0.1:9/hook")
    assert attempt.verdict is verdict, attempt
    assert said in attempt.error_message, attempt
    assert PASSWORD not in attempt.error_message
    if verdict is Verdict.RETRY and said != "proxy":
        assert "proxy http://127.0.0.1:" in attempt.error_message
        assert "egress" not in attempt.error_message  # no credential, not even the user


async def test_an_unreachable_proxy_is_not_sent(kind: str) -> None:
    sender = _sender(kind, Proxy("127.0.0.1", 9, "egress", PASSWORD), allow_private=True)
    try:
        attempt = await send(
            sender, _endpoint("http://127.0.0.1:8/h"), _message(), timeout=2, user_agent="t"
        )
    finally:
        await sender.aclose()
    assert attempt.verdict is Verdict.RETRY, attempt
    assert "proxy" in attempt.error_message and PASSWORD not in attempt.error_message


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("ftp://egress:3128", "must start with http://"),
        ("https://egress:3128", "must start with http://"),
        ("http://:3128", "has no host"),
        (f"http://u:{PASSWORD}@egress:3128/path", "no path"),
        (f"http://u:{PASSWORD}@egress:99999", "not a URL"),
    ],
)
def test_a_bad_proxy_url_is_refused_without_its_password(value: str, said: str) -> None:
    with pytest.raises(ValueError, match=said) as refused:
        parse_proxy(value)
    assert PASSWORD not in str(refused.value)
    with pytest.raises(ConfigurationError) as invalid:
        load_settings(proxy_url=value)
    assert PASSWORD not in str(invalid.value)


def test_the_proxy_setting_keeps_its_password_to_itself() -> None:
    settings = load_settings(proxy_url=f"http://egress:{PASSWORD}@127.0.0.1:3128")
    assert settings.proxy == Proxy("127.0.0.1", 3128, "egress", PASSWORD)
    assert PASSWORD not in repr(settings) and PASSWORD not in repr(settings.proxy)
    assert settings.proxy is not None and PASSWORD not in settings.proxy.shown
