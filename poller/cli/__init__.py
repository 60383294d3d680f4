"""The ``poller`` command. One module per command group; this one wires them.

Exit codes: 0 ok, 1 not found / nothing matched, 2 usage, configuration or
connection error — expected errors print one line, never a traceback
(``--verbose`` shows it).
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import click

from poller.errors import PollerError, UnknownEndpoint

EXIT_NOT_FOUND = 1
EXIT_USAGE = 2


class _Group(click.Group):
    """Turns expected errors into one line on stderr and the right exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except (UnknownEndpoint, LookupError) as exc:  # unknown name or id, nothing matched
            _fail(ctx, exc, EXIT_NOT_FOUND)
        except PollerError as exc:
            _fail(ctx, exc, EXIT_USAGE)
        except Exception as exc:
            from sqlalchemy.exc import OperationalError

            if isinstance(exc, OperationalError):
                reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
                _fail(ctx, f"cannot reach the database: {reason}", EXIT_USAGE, exc)
            raise


def _fail(ctx: click.Context, error: object, code: int, exc: BaseException | None = None) -> None:
    del exc  # the traceback printed under --verbose is the current exception's
    root = ctx.find_root()
    if root.params.get("verbose"):
        traceback.print_exc()
    from poller.cli.output import safe_text

    click.echo(f"error: {safe_text(str(error))}", err=True)
    sys.exit(code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="webhook-poller", prog_name="poller")
def cli(verbose: bool) -> None:
    """webhook-poller: transactional outbox delivered as signed webhooks."""


def _register() -> None:
    from poller.cli import admin, dashboard, db, demo, embedded, endpoints, enqueue, receiver, run

    cli.add_command(admin.admin)
    cli.add_command(endpoints.endpoints)
    cli.add_command(enqueue.enqueue)
    cli.add_command(enqueue.publish)
    cli.add_command(db.db)
    cli.add_command(embedded.embedded)
    cli.add_command(demo.demo)
    cli.add_command(run.run)
    cli.add_command(receiver.receiver)
    cli.add_command(dashboard.dashboard)


_register()


VERBOSE_FLAGS = ("--verbose", "-v")


def hoist_verbose(args: list[str]) -> list[str]:
    """``poller admin show 7 --verbose`` means what ``poller --verbose admin show 7`` does:
    the flag is the group's, so move it in front (never past a ``--``)."""
    end = args.index("--") if "--" in args else len(args)
    found = [a for a in args[:end] if a in VERBOSE_FLAGS]
    if not found:
        return args
    rest = [a for a in args[:end] if a not in VERBOSE_FLAGS] + args[end:]
    return ["--verbose", *rest]


def main() -> None:
    cli(args=hoist_verbose(sys.argv[1:]), prog_name="poller")
