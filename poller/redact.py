"""What errors, logs, spans and events show of a URL: its scheme, host and port.

Pure (the standard library only), so the error tree (poller/errors.py) can redact the
words a sender's error carries before anyone reads them.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]*")


def shown_url(url: str) -> str:
    """``url`` as errors, logs, spans and events show it: its scheme, host and port,
    never its credentials, path or query — for a Slack- or Discord-style receiver the
    path *is* the credential, and a query often holds a token (``…/…`` marks what was
    left out)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return url.partition("://")[0] + "://…"
    if ":" in host:
        host = f"[{host}]"
    shown = f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")
    rest = url.partition("://")[2].partition("/")[2]
    return shown + ("/…" if rest or parts.query else "")


def scrub_urls(text: str) -> str:
    """``text`` with every URL in it as :func:`shown_url` shows it: an HTTP client's
    error quotes the URL it was given, path and query and all."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda found: shown_url(found.group(0)), text)
