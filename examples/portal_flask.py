"""Your customers manage their own webhooks: a Flask app's "Webhooks" settings page that
shows the tenant portal of the signed-in customer's organisation in an iframe.

    pip install flask
    export POLLER_PORTAL_KEY=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')
    export POLLER_PORTAL_URL=http://127.0.0.1:8188            # where browsers reach it
    export POLLER_PORTAL_EMBED_ORIGINS='["http://127.0.0.1:5000"]'   # this app may frame it
    poller serve &                                         # serves /portal too
    flask --app examples/portal_flask:app run --port 5000
    open http://127.0.0.1:5000/settings/webhooks

Each time the page is shown, the app asks for a new link (15 minutes, the default):
it signs the tenant with POLLER_PORTAL_KEY and needs no database. Whoever holds the
link gets that tenant's portal until it expires, so make it for a signed-in user of
that tenant alone, on a page nobody else sees; an iframe of an origin not listed in
POLLER_PORTAL_EMBED_ORIGINS is refused by the browser.
"""

from __future__ import annotations

from flask import Flask, abort, render_template_string

import poller

app = Flask("shop")

PAGE = """<!doctype html>
<title>Webhooks · Shop</title>
<h1>Webhooks for {{ org }}</h1>
<p>Add the URLs that should hear of your orders; see every delivery and send one again.</p>
<iframe src="{{ link }}" title="Webhooks" style="width: 100%; height: 80vh; border: 0"></iframe>
"""


def signed_in_organisation() -> str | None:
    """Your application's own sign-in; here, everyone is acme."""
    return "acme"


@app.get("/settings/webhooks")
def webhooks() -> str:
    org = signed_in_organisation()
    if org is None:
        abort(401)
    link = poller.portal_link(tenant=org)  # POLLER_PORTAL_KEY, POLLER_PORTAL_URL
    return render_template_string(PAGE, org=org, link=link)
