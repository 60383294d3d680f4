"""``poller dashboard``: the operator's web page — a second face on ``poller admin``.

Server-rendered (Starlette + Jinja2, autoescaped), a few lines of plain JS for
the live refresh, no build step; templates and assets ship in the package.
Every page reads through the functions the CLI uses (poller/admin.py,
poller/ordering.py, poller/shards.py) and every action calls the CLI's
functions, recording who acted (``dashboard:<who>@<address>``).

Security, because the pages show payloads:

* off unless started (``poller dashboard``), on ``127.0.0.1:8188`` unless
  ``POLLER_DASHBOARD_ADDR`` says otherwise;
* always authenticated (poller/dashboard/auth.py): a token or HTTP basic, and
  a session cookie that is ``HttpOnly`` and ``SameSite=Strict``;
* actions are POSTs behind a confirmation page, with a CSRF token and an
  origin check; ``POLLER_DASHBOARD_READ_ONLY`` removes them;
* a strict Content-Security-Policy (scripts and styles from this server only,
  no inline script or style, no framing), ``nosniff``, ``no-store``;
* no signing secret is ever read into a page: endpoints are shown from
  ``admin.health_report`` and the endpoint list without their secrets.
"""

from poller.dashboard.app import create_app

__all__ = ["create_app"]
