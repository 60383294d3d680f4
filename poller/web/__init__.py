"""The web faces over one shared base: the operator's dashboard (poller/web/dashboard),
the management API (poller/web/api) and the tenant portal (poller/web/portal).

The base is what they all stand on: authentication (auth.py), security headers,
rendering and the request's ground (base.py); app.py assembles the faces a process
serves into one ASGI app and serve.py serves it (``poller serve``, also ``poller
dashboard``). A face imports the core and this base, never another face. Templates
and assets ship in the package (templates/, static/): server-rendered (Starlette +
Jinja2, autoescaped), a few lines of plain JS, no build step.

Security, because the pages show payloads:

* off unless started (``poller serve``), on ``127.0.0.1:8188`` unless
  ``POLLER_DASHBOARD_ADDR`` says otherwise;
* always authenticated (poller/web/auth.py): a token or HTTP basic, and
  a session cookie that is ``HttpOnly`` and ``SameSite=Strict``;
* actions are POSTs behind a confirmation page, with a CSRF token and an
  origin check; ``POLLER_DASHBOARD_READ_ONLY`` removes them;
* a strict Content-Security-Policy (scripts and styles from this server only,
  no inline script or style, no framing), ``nosniff``, ``no-store``;
* no signing secret is ever read into a page.
"""
