"""A webhook receiver for webhook-poller in Flask: verify, apply once, answer lookups.

    pip install flask standardwebhooks
    WEBHOOK_SECRET=whsec_... flask --app examples/flask_receiver run --port 8080

Then point an endpoint at it (a local receiver needs private targets allowed)::

    POLLER_ALLOW_PRIVATE_TARGETS=true poller endpoints add shop http://127.0.0.1:8080/webhooks \\
        --lookup-url 'http://127.0.0.1:8080/webhooks/{idempotency_key}'

``processed`` stands in for a table with a unique key on the webhook id: apply
the event and record its id in the same transaction, and a redelivery (the
contract is at least once) changes nothing.
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, abort, request
from standardwebhooks import Webhook, WebhookVerificationError

app = Flask(__name__)
webhook = Webhook(os.environ.get("WEBHOOK_SECRET", "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"))
processed: dict[str, Any] = {}  # webhook-id -> the event; use a table in real life


@app.post("/webhooks")
def receive() -> tuple[str, int]:
    try:  # checks the signature and that the timestamp is recent (replays fail)
        event = webhook.verify(request.get_data(), dict(request.headers))
    except WebhookVerificationError:
        abort(401)
    key = request.headers["webhook-id"]
    if key not in processed:  # at-least-once in, exactly-once effect
        processed[key] = event  # ... apply the event here, in the same transaction
    return "", 204


@app.get("/webhooks/<path:key>")
def lookup(key: str) -> tuple[str, int]:
    """The lookup contract: 200 if this webhook-id was processed, 404 if not."""
    return ("", 200) if key in processed else ("", 404)
