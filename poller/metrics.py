"""Prometheus metrics (prometheus-client, the default registry).

Names follow Prometheus conventions (``webhook_poller_…_total``, ``_seconds``);
labels never carry URLs, keys or tenant data. These are per process: sum
counters across pollers, and take ``max``/``sum`` of gauges as their help
says. (Serving them on ``POLLER_METRICS_ADDR`` comes with the operations work.)
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

ELECTION_BACKEND_UP = Gauge(
    "webhook_poller_election_backend_up",
    "1 while this poller reaches its election backend, 0 while it fails open or closed.",
)
ELECTION_BACKEND_ERRORS = Counter(
    "webhook_poller_election_backend_errors_total",
    "Election backend calls that failed (the poller then fails open or closed).",
)
LEADERSHIP_CHANGES = Counter(
    "webhook_poller_leadership_changes_total",
    "Shard leases this poller gained or lost.",
)
SHARDS_HELD = Gauge(
    "webhook_poller_shards_held",
    "Shards this poller leads (sum across pollers = shards covered).",
)
STALE_LEADER_CLAIMS = Counter(
    "webhook_poller_stale_leader_claims_total",
    "Claims refused by PostgreSQL because a newer leader holds the shard (shard fence).",
)
