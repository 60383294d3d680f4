"""The options ``poller endpoints add`` and ``update`` share, and how they are read.

Limits and health settings (a number or ``default``), the retry schedule
(durations, poller/rules/parse.py), subscriptions, and headers — whose values are
credentials, so an error here never repeats what was typed after a header's name.
"""

from __future__ import annotations

from typing import Any

import click

from poller.rules.health import DEFAULT, MAX_RATE, MIN_COOLDOWN, MIN_RATE


class OrDefault(click.ParamType[Any]):
    """A number in a range, or ``default`` (back to the global setting / no limit)."""

    def __init__(self, kind: type, low: float, high: float, *, low_open: bool = False) -> None:
        self.kind, self.low, self.high, self.low_open = kind, low, high, low_open
        self.name = "number|default"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is DEFAULT or str(value).strip().lower() == "default":
            return DEFAULT
        try:
            number = self.kind(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a {self.kind.__name__} or 'default'", param, ctx)
        low_ok = number > self.low if self.low_open else number >= self.low
        if not (low_ok and number <= self.high):  # also refuses nan
            edge = "more than" if self.low_open else "at least"
            self.fail(
                f"{value!r} must be {edge} {self.low:g} and at most {self.high:g}", param, ctx
            )
        return number


class RetrySchedule(click.ParamType[Any]):
    """``5s,5m,30m,2h`` (durations, poller/rules/parse.py) → seconds, or ``default``."""

    name = "schedule|default"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from poller.errors import InvalidInput
        from poller.rules import parse

        if value is DEFAULT or str(value).strip().lower() == "default":
            return DEFAULT
        try:
            return [parse.duration(part).total_seconds() for part in str(value).split(",")]
        except InvalidInput as exc:
            self.fail(f"{exc} (give durations separated by commas, e.g. 5s,5m,30m)", param, ctx)


class AgeLimit(click.ParamType[Any]):
    """``3d`` (a duration, poller/rules/parse.py) → seconds, or ``none`` (no limit)."""

    name = "duration|none"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from poller.errors import InvalidInput
        from poller.rules import parse

        if value is DEFAULT or str(value).strip().lower() in ("none", "default"):
            return DEFAULT
        try:
            return parse.duration(str(value)).total_seconds()  # refuses 0 and less
        except InvalidInput as exc:
            self.fail(f"{exc} (e.g. 3d, 12h; 'none': no limit)", param, ctx)


class PemFile(click.ParamType[Any]):
    """A PEM file's text (poller/endpoints/tls.py checks what it holds); with
    ``removable``, ``none`` removes the setting."""

    name = "file"

    def __init__(self, *, removable: bool) -> None:
        self.removable = removable
        self.name = "file|none" if removable else "file"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from pathlib import Path

        if value is DEFAULT or (self.removable and str(value).strip().lower() == "none"):
            return DEFAULT
        path = Path(str(value))
        if "\x00" in str(value):  # no file is named so (the OS refuses to look)
            self.fail(f"{str(value)!r} does not exist", param, ctx)
        try:
            if path.stat().st_size > 1024 * 1024:
                self.fail(f"{str(value)!r} is larger than 1 MiB: not a PEM file", param, ctx)
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self.fail(f"{str(value)!r} does not exist", param, ctx)
        except UnicodeDecodeError:
            self.fail(f"{str(value)!r} is not PEM text (binary DER? convert it)", param, ctx)
        except OSError as exc:
            self.fail(f"{str(value)!r} cannot be read: {exc.strerror}", param, ctx)


def tls_options(func: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "--client-cert",
                type=PemFile(removable=True),
                help="PEM client certificate for mutual TLS, with --client-key ('none' "
                "removes both).",
            ),
            click.option(
                "--client-key",
                type=PemFile(removable=False),
                help="Its unencrypted PEM key (stored encrypted like the secret, never shown).",
            ),
            click.option(
                "--ca-bundle",
                type=PemFile(removable=True),
                help="PEM CA certificates the endpoint's certificate chains to: then only "
                "they are trusted for it ('none' removes it).",
            ),
        ]
    ):
        func = option(func)
    return func


def limit_options(func: Any) -> Any:
    for option in reversed(
        [
            click.option("--lookup-url", help="Lookup URL template with {idempotency_key}."),
            click.option("--max-attempts", type=click.IntRange(1, 1000)),
            click.option("--timeout", type=click.FloatRange(0, min_open=True), help="Seconds."),
            click.option("--max-in-flight", type=click.IntRange(1, 10_000)),
            click.option(
                "--on-failed-head",
                type=click.Choice(["block", "skip"]),
                help="Ordered keys whose head fails for good: block (default) or skip it.",
            ),
            click.option(
                "--rate-limit",
                type=OrDefault(float, MIN_RATE, MAX_RATE),
                help="Requests per second across all pollers ('default': unlimited).",
            ),
            click.option(
                "--rate-burst",
                type=OrDefault(int, 1, 1_000_000),
                help="Requests allowed at once (default: one second's worth).",
            ),
            click.option(
                "--circuit-failures",
                type=OrDefault(int, 0, 1_000_000),
                help="Failed sends in a row that open the circuit (0: never; "
                "'default': POLLER_CIRCUIT_FAILURES).",
            ),
            click.option(
                "--retry-schedule",
                type=RetrySchedule(),
                help="Its own retry schedule, e.g. 5s,5m,30m,2h,5h (the last repeats; "
                "'default': POLLER_RETRY_SCHEDULE).",
            ),
            click.option(
                "--trace-context/--no-trace-context",
                default=None,
                help="Send the message's trace context (traceparent) to it, when the "
                "application enqueued inside an OpenTelemetry span (the default); "
                "--no-trace-context for a third party that should not see trace ids.",
            ),
            click.option(
                "--max-age",
                type=AgeLimit(),
                help="Messages older than this end failed (expired) instead of being sent, "
                "e.g. 3d ('none': no limit, the default).",
            ),
            click.option(
                "--circuit-cooldown",
                type=OrDefault(float, MIN_COOLDOWN, 86400),
                help="Seconds open before a probe ('default': POLLER_CIRCUIT_COOLDOWN).",
            ),
        ]
    ):
        func = option(func)
    return func


def subscription_options(func: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "--events",
                "event_types",
                help="Published event types it receives: names and prefix* patterns, "
                "comma-separated ('invoice.*,customer.created'; '*': all; '': none).",
            ),
            click.option(
                "--tenant",
                help="Receive only events published for this tenant ('': no tenant).",
            ),
            click.option(
                "--filter",
                "payload_filter",
                help='A JSON object the payload must contain, e.g. \'{"region": "eu"}\' '
                "('': none).",
            ),
        ]
    ):
        func = option(func)
    return func


def subscription_changes(
    event_types: str | None, tenant: str | None, payload_filter: str | None
) -> dict[str, Any]:
    """The options as update_endpoint's arguments: '' clears (no subscriptions, tenant, filter)."""
    return {
        "event_types": event_types,
        "tenant": DEFAULT if tenant == "" else tenant,
        "payload_filter": DEFAULT if payload_filter == "" else payload_filter,
    }


def _header_lines(_ctx: click.Context, _param: click.Parameter, source: Any) -> tuple[str, ...]:
    """``--headers-from``: its lines ``NAME: VALUE`` (blank ones and ``#`` comments
    skipped), read from a file or standard input (``-``)."""
    if source is None:
        return ()
    lines = (line.strip() for line in source.read().splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


def header_option(func: Any) -> Any:
    """``--header 'NAME: VALUE'`` and ``--headers-from FILE``: a value given on the
    command line is in the process list for every user of the host to read, so a
    credential may come from a file or standard input instead (``-``)."""
    func = click.option(
        "--headers-from",
        "headers_from",
        type=click.File("r", encoding="utf-8"),
        callback=_header_lines,
        metavar="FILE",
        help="Headers from a file, or standard input with '-': a line 'NAME: VALUE' each "
        "(kept out of the process list, where --header's values are).",
    )(func)
    return click.option(
        "--header",
        "header",
        multiple=True,
        metavar="'NAME: VALUE'",
        help="A header sent with every delivery and lookup, e.g. 'Authorization: Bearer …' "
        "(repeatable; stored encrypted like the secret, never shown; on update 'NAME:' "
        "removes one). Its value shows in the process list: for a credential, use "
        "--headers-from.",
    )(func)


def signing_option(func: Any) -> Any:
    return click.option(
        "--signing",
        type=click.Choice(["hmac-sha256", "ed25519"]),
        help="Signature scheme: hmac-sha256 (v1, a shared whsec_ secret; the default) or "
        "ed25519 (v1a: the receiver verifies with a whpk_ public key). On rotate-secret it "
        "changes the scheme; by default the new key is of the current one.",
    )(func)


def header_changes(given: tuple[str, ...], *, removals: bool) -> dict[str, str | None]:
    """``--header`` values as names → values (None: remove). An error never repeats what
    was typed after the name: it may be a credential."""
    changes: dict[str, str | None] = {}
    for item in given:
        name, colon, value = item.partition(":")
        if not colon or not name.strip():
            raise click.UsageError("--header takes 'NAME: VALUE' (a name, a colon, the value)")
        value = value.strip()
        if not value and not removals:
            raise click.UsageError(f"--header {name.strip()!r}: give a value after the colon")
        changes[name.strip()] = value or None
    return changes
