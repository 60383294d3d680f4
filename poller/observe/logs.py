"""Logging: JSON lines in production, readable lines in a terminal.

``POLLER_LOG_FORMAT=auto`` (default) writes JSON unless stderr is a terminal.
Each JSON line has ``ts`` (ISO 8601 UTC), ``level``, ``logger``, ``message``,
``poller`` (its name, under ``poller run``) and any structured fields the call
passed (``extra={...}``): delivery lines carry ``message_id``, ``key``,
``attempt`` and ``endpoint``. Secrets and payloads are never logged.

Messages carry text from outside (a receiver's error, a name), and logs are
read in terminals (``tail -f``): both formats escape every character a terminal
could act on (C0/C1 controls, ESC sequences, bidi overrides; lone surrogates,
which could not even be written) — ``\\x1b`` in a console line, ``\\u001b`` in
JSON, the same JSON to a parser.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

outage_log = logging.getLogger("poller.outage")


def printable(text: str, keep: str = "") -> str:
    """``text`` with every character a terminal could act on (but those in ``keep``)
    spelled as a Python escape: ``\\x1b``, ``\\u202e``."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or c in keep else c.encode("unicode_escape").decode() for c in text
    )


def printable_json(document: object, **dumps: object) -> str:
    """:func:`json.dumps` (non-ASCII kept) with every character a terminal could act on
    escaped as ``\\uXXXX``: the same JSON to a parser."""
    text = json.dumps(document, ensure_ascii=False, **dumps)  # type: ignore[arg-type]
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == "\n" else json.dumps(c)[1:-1] for c in text)


_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return printable_json(line, default=str)


class ConsoleFormatter(logging.Formatter):
    """One line per message (a newline in a receiver's text cannot forge a second
    log line); a traceback keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return printable(super().formatException(ei), keep="\n")


class _Poller(logging.Filter):
    """Stamps each record with the poller's name (``poller`` in JSON lines): the
    children of ``poller run --processes`` share one stderr."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.poller = name

    def filter(self, record: logging.LogRecord) -> bool:
        record.poller = self.poller
        return True


def configure(log_format: str, level: int = logging.INFO, poller_id: str | None = None) -> None:
    """Root logging for ``poller run``: JSON or console, quiet third-party loggers."""
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    console = "%(asctime)s %(levelname)-7s " + ("%(poller)s " if poller_id else "")
    handler.setFormatter(
        JsonFormatter() if use_json else ConsoleFormatter(console + "%(name)s %(message)s")
    )
    if poller_id:
        handler.addFilter(_Poller(poller_id))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "aiohttp.access", "sqlalchemy", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


OUTAGE_LOG_EVERY = 30.0  # while the database is away, one line per this many seconds


class OutageLog:
    """Log the first failure of an outage, then one line per interval with the count."""

    def __init__(self, what: str, every: float = OUTAGE_LOG_EVERY) -> None:
        self.what = what
        self.every = every
        self.failures = 0
        self._last = 0.0

    def failed(self, exc: BaseException) -> None:
        from poller.observe import metrics  # the service's: an application's door never gets here

        self.failures += 1
        metrics.DB_ERRORS.inc()
        now = time.monotonic()
        if self.failures == 1 or now - self._last >= self.every:
            self._last = now
            outage_log.warning(
                "%s: database unavailable (%d %s so far), retrying: %s",
                self.what,
                self.failures,
                "failure" if self.failures == 1 else "failures",
                exc,
            )

    def recovered(self) -> None:
        if self.failures:
            outage_log.warning("%s: database back after %d failures", self.what, self.failures)
            self.failures = 0
