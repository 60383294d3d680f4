"""``poller receiver``: the reference receiver, with fault injection."""

from __future__ import annotations

import asyncio
import signal

import click

from poller.cli.run import event_loop_run
from poller.local.receiver import Faults, Receiver, serve
from poller.rules.signing import Verifier


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--secret", "secrets", multiple=True, help="whsec_ secret to verify (repeatable).")
@click.option(
    "--public-key",
    "public_keys",
    multiple=True,
    help="whpk_ public key of an ed25519 endpoint: verifies v1a signatures (repeatable).",
)
@click.option(
    "--require-header",
    "required",
    multiple=True,
    metavar="'NAME: VALUE'",
    help="A header every POST must carry, else 401 (repeatable), e.g. 'Authorization: Bearer x'.",
)
@click.option("--fail-rate", default=0.0, type=click.FloatRange(0, 1), show_default=True)
@click.option(
    "--status",
    default=500,
    type=click.IntRange(100, 599),
    show_default=True,
    help="Status of injected failures.",
)
@click.option("--retry-after", help="Retry-After header on injected failures.")
@click.option("--latency", default=0.0, type=click.FloatRange(0), show_default=True)
@click.option(
    "--drop-after-process-rate",
    default=0.0,
    type=click.FloatRange(0, 1),
    show_default=True,
    help="Apply, then close without answering.",
)
@click.option(
    "--ack-and-discard",
    default=0,
    type=click.IntRange(0),
    hidden=True,
    help="Answer 200 to the first N messages but lose them (tests the tests).",
)
@click.option(
    "--gone-after",
    type=click.IntRange(0),
    hidden=True,
    help="Answer 410 once N messages were applied (chaos tests).",
)
@click.option("--spike-rate", default=0.0, type=click.FloatRange(0, 1), hidden=True)
@click.option(
    "--spike",
    default=0.0,
    type=click.FloatRange(0),
    hidden=True,
    help="Seconds a spiked request waits before it is handled.",
)
def receiver(
    host: str,
    port: int,
    secrets: tuple[str, ...],
    public_keys: tuple[str, ...],
    required: tuple[str, ...],
    fail_rate: float,
    status: int,
    retry_after: str | None,
    latency: float,
    drop_after_process_rate: float,
    ack_and_discard: int,
    gone_after: int | None,
    spike_rate: float,
    spike: float,
) -> None:
    """Serve the reference receiver until SIGTERM/SIGINT.

    It verifies signatures with --secret and --public-key (without either it
    accepts anything),
    applies each webhook-id once, answers lookups at GET /webhooks/{key}, and
    reports GET /stats — including commit→receipt latency, read from an
    ``enqueued_at`` field (epoch seconds) in the payload when there is one.
    """
    keys = [*secrets, *public_keys]
    wanted = {}
    for given in required:
        name, colon, value = given.partition(":")
        if not colon or not name.strip() or not value.strip():
            raise click.BadParameter("give 'NAME: VALUE'", param_hint="--require-header")
        wanted[name.strip()] = value.strip()
    try:
        Verifier(keys)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--secret/--public-key") from None
    if not keys:
        click.echo(
            "warning: no --secret or --public-key given: signatures are not checked, "
            "any request is accepted",
            err=True,
        )
    faults = Faults(
        ack_and_discard=ack_and_discard,
        gone_after=gone_after,
        spike_rate=spike_rate,
        spike=spike,
        fail_rate=fail_rate,
        status=status,
        retry_after=retry_after,
        latency=latency,
        drop_after_process_rate=drop_after_process_rate,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(Receiver(keys, faults, wanted), host, port, stop=stop)

    event_loop_run(main())
