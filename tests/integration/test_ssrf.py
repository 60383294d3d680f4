"""G10: no private target is reached, through either HTTP client, in any spelling.

Every test points a real sender at a real receiver on 127.0.0.1 and counts
what arrives there: zero, with the pre-flight check on and with it switched
off (so the guard at the connection seam is what holds).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import httpcore
import pytest

from poller.deliver import aiohttp_sender as senders
from poller.deliver import reqwest_sender
from poller.deliver.aiohttp_sender import AiohttpSender
from poller.deliver.delivery import lookup, send
from poller.deliver.wire import Sender
from poller.endpoints.netguard import GuardedBackend
from poller.local.embedded import free_port
from poller.local.receiver import Receiver
from poller.rules.outcomes import Attempt, LookupAnswer, Verdict
from tests.integration import senders as every
from tests.integration.test_delivery import _endpoint, _message

LOOPBACK_SPELLINGS = [
    "127.0.0.1",
    "2130706433",
    "0177.0.0.1",
    "0x7f.0.0.1",
    "0x7f000001",
    "0x7F.1",
    "127.1",
    "127.0.1",
    "017700000001",
    "127.0.0.1.",
    "127.000.000.001",
    "localhost",
    "LocalHost",
    "localhost.",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[0:0:0:0:0:ffff:127.0.0.1]",
    "[::1]",
]


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, int]]:
    rec = Receiver()
    port = await rec.start("127.0.0.1", 0)
    yield rec, port
    await rec.stop()


async def _send_once(sender: Sender, url: str) -> Attempt:
    """One send, then the sender is closed."""
    try:
        return await send(sender, _endpoint(url), _message(), timeout=2, user_agent="t")
    finally:
        await sender.aclose()


def _sender(kind: str, **options: object) -> Sender:
    return every.make(kind, allow_private=False, **options)


@pytest.fixture(params=["preflight", "seam only"])
def guard_layers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "seam only":
        for module in (senders, reqwest_sender):
            monkeypatch.setattr(module, "preflight", lambda url, allow_private: None)
    yield request.param


@pytest.mark.parametrize("kind", every.KINDS)
@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
async def test_no_spelling_of_loopback_reaches_the_receiver(
    receiver: tuple[Receiver, int], guard_layers: str, kind: str, host: str
) -> None:
    rec, port = receiver
    attempt = await _send_once(_sender(kind), f"http://{host}:{port}/hook")
    assert rec.stats.received == 0
    assert attempt.verdict is Verdict.RETRY  # known not sent: retried, never "maybe delivered"


class _Resolves:
    """aiohttp resolver giving a fixed answer (no real DNS here gives a 10.x one)."""

    def __init__(self, address: str) -> None:
        self.address = address

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[dict[str, object]]:
        return [
            {
                "hostname": host,
                "host": self.address,
                "port": port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": 0,
            }
        ]

    async def close(self) -> None: ...


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "169.254.169.254", "100.64.0.1"])
async def test_a_name_resolving_to_a_private_address_is_refused_by_aiohttp(
    receiver: tuple[Receiver, int], address: str
) -> None:
    rec, port = receiver
    sender = AiohttpSender(resolver=_Resolves(address))  # type: ignore[arg-type]
    attempt = await _send_once(sender, f"http://hooks.example:{port}/")
    assert rec.stats.received == 0 and attempt.verdict is Verdict.RETRY
    assert f"refused to connect to {address}" in (attempt.error_message or "")


@pytest.mark.parametrize("kind", ["httpx", "reqwest"])
@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "::1", "::ffff:10.0.0.1"])
async def test_a_name_resolving_to_a_private_address_is_refused(
    receiver: tuple[Receiver, int], address: str, kind: str
) -> None:
    rec, port = receiver

    async def resolve(host: str, port: int) -> list[str]:
        return [address]

    sender = _sender(kind, resolve=resolve)
    attempt = await _send_once(sender, f"http://hooks.example:{port}/")
    assert rec.stats.received == 0 and attempt.verdict is Verdict.RETRY
    said = attempt.error_message or ""  # a tenant reads it: no operator's setting
    assert "refused" in said and "POLLER_ALLOW_PRIVATE_TARGETS" not in said


async def test_httpx_connects_to_the_address_it_checked_without_resolving_again() -> None:
    """DNS rebinding: the name is resolved once, and that checked address is connected to."""
    resolved: list[str] = []
    connected: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        resolved.append(host)
        return ["8.8.8.8"] if len(resolved) == 1 else ["127.0.0.1"]  # a rebinding answer

    class Recording(httpcore.AsyncNetworkBackend):
        async def connect_tcp(self, host: str, port: int, *args: object, **kw: object):  # type: ignore[no-untyped-def, override]
            connected.append(host)
            raise httpcore.ConnectError("no network in tests")  # nothing leaves the machine

    backend = GuardedBackend(resolve, inner=Recording())
    with pytest.raises(httpcore.ConnectError):
        await backend.connect_tcp("rebind.example", 80, timeout=1)
    assert resolved == ["rebind.example"] and connected == ["8.8.8.8"]


async def test_reqwest_connects_to_the_address_it_checked_and_pins_it(
    receiver: tuple[Receiver, int],
) -> None:
    """reqwest never resolves a name itself: the guard's answer is pinned (no DNS here
    knows hooks.example), and asked for again only after its time to live."""
    rec, port = receiver
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    sender = every.make("reqwest", allow_private=True, resolve=resolve)
    try:
        for _ in range(3):
            attempt = await send(
                sender, _endpoint(f"http://hooks.example:{port}/hook"), _message(),
                timeout=2, user_agent="t",
            )  # fmt: skip
            assert attempt.verdict is Verdict.DELIVERED, attempt
    finally:
        await sender.aclose()
    assert rec.stats.received == 3 and asked == ["hooks.example"]


async def test_httpx_spends_one_connect_budget_on_all_of_a_hosts_addresses() -> None:
    """A blackholed host with an A and an AAAA record: both connects share one budget."""
    budgets: list[float] = []

    async def resolve(host: str, port: int) -> list[str]:
        return ["8.8.8.8", "2001:4860:4860::8888"]

    class Blackhole(httpcore.AsyncNetworkBackend):
        async def connect_tcp(
            self, host: str, port: int, timeout: float | None = None, *args: object, **kw: object
        ):  # type: ignore[no-untyped-def, override]
            assert timeout is not None
            budgets.append(timeout)
            await asyncio.sleep(timeout)  # the SYN is never answered
            raise httpcore.ConnectTimeout("no network in tests")

    backend = GuardedBackend(resolve, inner=Blackhole())
    began = time.monotonic()
    with pytest.raises(httpcore.ConnectTimeout):
        await backend.connect_tcp("blackhole.example", 80, timeout=0.4)
    assert time.monotonic() - began < 0.7  # was 0.8: the budget once per address
    assert len(budgets) == 2 and sum(budgets) <= 0.4 + 1e-6  # each address a share


@pytest.mark.parametrize("kind", every.KINDS)
async def test_proxy_environment_variables_are_ignored(
    receiver: tuple[Receiver, int], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec, port = receiver
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    sender = every.make(kind, allow_private=True)

    attempt = await _send_once(sender, f"http://127.0.0.1:{free_port()}/hook")
    assert rec.stats.received == 0  # a proxy would have relayed it to the receiver
    assert attempt.verdict is Verdict.RETRY and attempt.error_class in ("ConnectError",)


def test_aiohttp_is_recent_enough_for_the_socket_seam() -> None:
    import inspect

    assert "socket_factory" in inspect.signature(aiohttp.TCPConnector).parameters


@pytest.mark.parametrize("kind", every.KINDS)
async def test_lookups_are_guarded_too(
    receiver: tuple[Receiver, int], guard_layers: str, kind: str
) -> None:
    rec, port = receiver
    endpoint = _endpoint(
        "https://hooks.example/in",
        lookup_url=f"http://2130706433:{port}/webhooks/{{idempotency_key}}",
    )
    sender = _sender(kind)
    try:
        answer, attempt = await lookup(sender, endpoint, _message(), timeout=2, user_agent="t")
    finally:
        await sender.aclose()
    assert rec.stats.lookups_found + rec.stats.lookups_missing == 0
    assert answer is LookupAnswer.ERROR and attempt.error_class in ("ConnectError", "InvalidURL")
