"""Logging: JSON lines in production, readable lines in a terminal.

``POLLER_LOG_FORMAT=auto`` (default) writes JSON unless stderr is a terminal.
Each JSON line has ``ts`` (ISO 8601 UTC), ``level``, ``logger``, ``message``,
``poller`` (its name, under ``poller run``) and any structured fields the call
passed (``extra={...}``): delivery lines carry ``message_id``, ``key``,
``attempt`` and ``endpoint``. Secrets and payloads are never logged.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

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
        return json.dumps(line, default=str, ensure_ascii=False)


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
        JsonFormatter() if use_json else logging.Formatter(console + "%(name)s %(message)s")
    )
    if poller_id:
        handler.addFilter(_Poller(poller_id))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "aiohttp.access", "sqlalchemy", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
