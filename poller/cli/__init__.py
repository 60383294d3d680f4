"""The ``poller`` command. One module per command group; this one wires them.

Exit codes: 0 ok, 1 not found / nothing matched (:class:`~poller.errors.NotFound`),
2 usage, configuration or connection error (any other
:class:`~poller.errors.PollerError`), 70 for anything else: an exception nobody
expected is a bug, said so in one line, never passed off as "not found".
Expected errors print one line, never a traceback (``--verbose`` shows it).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click

from poller.errors import NotFound, PollerError

EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_BUG = 70  # EX_SOFTWARE (sysexits.h)
BUG_HINT = "unexpected error (a bug in webhook-poller; run again with -v for the traceback)"


class _Group(click.Group):
    """Turns expected errors into one line on stderr and the right exit code."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """As click's, but a usage error is one line too (click prints a usage block,
        a hint and the error over four)."""
        args = [_text_arg(a) for a in (sys.argv[1:] if args is None else args)]
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        from poller.cli.output import safe_text

        try:
            done = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # `poller admin`: the help
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            hint = f" (see: {exc.ctx.command_path} -h)" if exc.ctx is not None else ""
            click.echo(f"error: {safe_text(exc.format_message())}{hint}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"error: {safe_text(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except (click.Abort, EOFError, KeyboardInterrupt):
            click.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(done if isinstance(done, int) else 0)  # --help, --version: their code

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except NotFound as exc:  # unknown name or id, nothing matched
            _fail(ctx, exc, EXIT_NOT_FOUND)
        except PollerError as exc:
            _fail(ctx, exc, EXIT_USAGE)
        except Exception as exc:
            from sqlalchemy.exc import OperationalError

            if isinstance(exc, OperationalError):
                reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
                _fail(ctx, f"cannot reach the database: {reason}", EXIT_USAGE)
            _fail(ctx, f"{BUG_HINT}: {type(exc).__name__}", EXIT_BUG)


def _text_arg(arg: str) -> str:
    """An argument as text: bytes that were not UTF-8 (Python keeps them as lone
    surrogates, which nothing can print or store) become U+FFFD."""
    if arg.isascii():
        return arg
    try:
        raw = arg.encode("utf-8", "surrogateescape")  # invalid bytes on the command line
    except UnicodeEncodeError:
        raw = arg.encode("utf-8", "surrogatepass")  # other lone surrogates
    return raw.decode("utf-8", "replace")


def _fail(ctx: click.Context, error: object, code: int) -> None:
    """One line on stderr and ``code``; under ``--verbose`` the current traceback first."""
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
