"""Prometheus metrics (prometheus-client, the default registry).

Names follow Prometheus conventions (``webhook_poller_…_total``, ``_seconds``);
labels never carry URLs, keys or tenant data — endpoint names only. Counters
and most gauges are per process: ``sum`` them across pollers. The gauges set
by the maintenance leader (pending due, oldest due age, messages by status)
describe the whole cluster, and only the leader refreshes them: aggregate with
``max by (endpoint)`` (a poller that lost the lease keeps its last values
until it restarts). Served on ``POLLER_METRICS_ADDR`` at ``/metrics``
(poller/service/ops.py).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from poller.observe.delivery_metrics import DeliveryMetrics

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

# --- claiming and delivering (per process; sum across pollers) -----------------------

CLAIMED = Counter("webhook_poller_claimed_total", "Messages claimed.")
DELIVERIES = DeliveryMetrics()
"""What every delivery counts, without a lock per update (poller/observe/delivery_metrics.py):
``webhook_poller_delivery_outcomes_total{endpoint,outcome}``,
``webhook_poller_attempts_total{kind}``, and the histograms
``webhook_poller_delivery_duration_seconds{endpoint}`` and
``webhook_poller_commit_to_delivery_seconds{endpoint}``; the first
``POLLER_METRICS_ENDPOINTS`` endpoints a process meets have their own series, the
rest count under ``endpoint="_other"``."""
METRICS_ENDPOINTS_FOLDED = Gauge(
    "webhook_poller_metrics_endpoints_folded",
    "1 when this process met more endpoints than POLLER_METRICS_ENDPOINTS: the rest count "
    'under endpoint="_other" in the delivery metrics.',
)
METRICS_ENDPOINTS_FOLDED.set_function(lambda: float(DELIVERIES.labels.folded))
LOOKUPS = Counter(
    "webhook_poller_lookups_total",
    "Result lookups, by answer (found, not_found, error).",
    ["result"],
)
STALE_COMPLETIONS = Counter(
    "webhook_poller_stale_completions_total",
    "Outcome writes refused by the claim-token fence (the claim had expired).",
)
DB_ERRORS = Counter(
    "webhook_poller_db_errors_total", "Transient database errors met (and retried)."
)
BROKER_CONNECTIONS = Counter(
    "webhook_poller_broker_connections_total",
    "Connections to brokers opened (a reconnect is one more) or failed, by broker kind "
    "(nats, amqp, redis) and result (opened, failed): poller/deliver/broker_links.py.",
    ["kind", "result"],
)
RECLAIMED = Counter("webhook_poller_reclaimed_total", "Expired claims reclaimed.")
CLAIMS_LOST = Counter(
    "webhook_poller_claims_lost_total",
    "Held claims the lease heartbeat found taken over (this poller was too slow or cut off).",
)
OFF_SCHEMA = Counter(
    "webhook_poller_off_schema_total",
    "Messages failed unsent: published through a SQL door with a payload its event type's "
    "JSON Schema refuses (the database cannot check it; the poller does before any send).",
)
LEASE_SHORT = Counter(
    "webhook_poller_lease_short_total",
    "Lookups or sends not started because too little claim lease was left for their timeout "
    "(the heartbeat could not reach the database, or the process was paused); handed back.",
)
LOOP_CRASHES = Counter(
    "webhook_poller_loop_crashes_total",
    "Supervised loops that crashed (the poller then stops and exits non-zero).",
    ["loop"],
)
CLAIM_SECONDS = Histogram(
    "webhook_poller_claim_duration_seconds",
    "One claim round (fences, claim, commit), whether it found messages or not.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
IN_FLIGHT = Gauge("webhook_poller_in_flight", "Deliveries under way in this poller.")

# --- cluster-wide gauges, set by the maintenance leader (take max by endpoint) ---------
# The per-endpoint ones have series only for endpoints with something to show
# (poller/service/maintenance.py GaugeRefresher): none for an endpoint at rest.

PENDING_DUE = Gauge(
    "webhook_poller_pending_due",
    "Pending messages due now, per endpoint (maintenance leader).",
    ["endpoint"],
)
OLDEST_DUE_SECONDS = Gauge(
    "webhook_poller_oldest_due_seconds",
    "Age of the oldest due pending message, per endpoint (maintenance leader).",
    ["endpoint"],
)
SPANS_DROPPED = Counter(
    "webhook_poller_spans_dropped_total",
    "Finished spans dropped: the export queue was full, or the collector refused them.",
)
SPANS_EXPORTED = Counter(
    "webhook_poller_spans_exported_total", "Finished spans the collector took."
)
MESSAGES = Gauge("webhook_poller_messages", "Messages by status (maintenance leader).", ["status"])
ORDERING_BLOCKED_KEYS = Gauge(
    "webhook_poller_ordering_blocked_keys",
    "Ordering keys whose head failed for good and waits for an operator, per endpoint.",
    ["endpoint"],
)
ORDERING_BLOCKED_SECONDS = Gauge(
    "webhook_poller_ordering_blocked_seconds",
    "How long the longest-blocked ordering key has been blocked, per endpoint (0: none).",
    ["endpoint"],
)
ORDERING_WAITING = Gauge(
    "webhook_poller_ordering_waiting",
    "Ordered messages waiting behind their key's head, per endpoint.",
    ["endpoint"],
)

CIRCUIT_STATE = Gauge(
    "webhook_poller_circuit_state",
    "Each endpoint's circuit: 0 closed, 1 half-open (a probe out), 2 open (maintenance leader).",
    ["endpoint"],
)
CIRCUIT_OPEN_SECONDS = Gauge(
    "webhook_poller_circuit_open_seconds",
    "How long the endpoint's circuit has not been closed (0: closed).",
    ["endpoint"],
)
ENDPOINT_ENABLED = Gauge(
    "webhook_poller_endpoint_enabled",
    "1 when the endpoint is enabled, 0 when disabled (by an operator, 410 Gone or auto-disable).",
    ["endpoint"],
)
DISABLED_PENDING = Gauge(
    "webhook_poller_endpoint_disabled_pending",
    "Pending messages that wait because their endpoint is disabled.",
    ["endpoint"],
)
CIRCUIT_OPENS = Counter(
    "webhook_poller_circuit_opens_total", "Circuits this poller's completions opened."
)
CIRCUIT_PROBES = Counter(
    "webhook_poller_circuit_probes_total", "Probe messages this poller claimed for open circuits."
)
ENDPOINT_PAUSES = Counter(
    "webhook_poller_endpoint_pauses_total",
    "429/503 answers with Retry-After that paused their whole endpoint.",
)


def sample_total(metric: Counter, **labels: str) -> float:
    """This process's total of a counter over the series matching ``labels`` (demo, tests)."""
    total = 0.0
    for family in metric.collect():
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
