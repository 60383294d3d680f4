"""The delivery metrics counted without locks (poller/observe/delivery_metrics.py) scrape exactly
as prometheus-client's own Counter and Histogram would, in both formats."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from poller.observe import delivery_metrics as dm
from poller.observe.delivery_metrics import DeliveryMetrics

TRACE = {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7"}
# (endpoint, duration, latency or None, outcome, exemplar), counted by two dispatchers in
# turn; the sums of a series split between them are exact in binary, so the order they
# are added in cannot change them; "edge" is on the buckets' bounds.
DELIVERIES = [
    ("billing", 0.0078125, 0.0078125, "delivered", None),
    ("billing", 0.25, 7.0, "delivered", TRACE),
    ("billing", 31.0, None, "retry", None),
    ("shipping", 0.0, 86400.0, "delivered", None),
    ("shipping", 2.5, 1e9, "delivered", TRACE),
    ("shipping", 0.5, None, "failed", None),
    ("edge", 0.005, 0.005, "delivered", None),
    ('ünïcode "quoted"\n', 0.01, 0.0, "delivered", None),
]


def _theirs(registry: CollectorRegistry) -> dict[str, Counter | Histogram]:
    """prometheus-client's own metrics of the same names, help, labels and buckets."""
    theirs: dict[str, Counter | Histogram] = {}
    for key, family in (("outcomes", dm.OUTCOMES), ("attempts", dm.ATTEMPTS)):
        theirs[key] = Counter(family.name, family.documentation, family.labels, registry=registry)
    for key, family, buckets in (
        ("seconds", dm.SECONDS, dm.SECONDS_BUCKETS),
        ("latency", dm.LATENCY, dm.LATENCY_BUCKETS),
    ):
        theirs[key] = Histogram(
            family.name, family.documentation, family.labels, registry=registry, buckets=buckets
        )
    return theirs


def _steady(text: bytes) -> list[str]:
    """The exposition's lines, sorted, with the times that differ between the two (the
    series' creation, an exemplar's moment) blanked out."""
    lines = text.decode().splitlines()
    lines = [re.sub(r"(_created\{.*\}) \S+$", r"\1 T", line) for line in lines]
    lines = [re.sub(r"(# \{.*\} \S+) \S+$", r"\1 T", line) for line in lines]
    return sorted(lines)


@pytest.mark.parametrize("render", [generate_latest, openmetrics.generate_latest])
def test_the_lock_free_delivery_metrics_scrape_as_prometheus_clients_own(render) -> None:  # type: ignore[no-untyped-def]
    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    ours = DeliveryMetrics(ours_registry)
    theirs = _theirs(theirs_registry)
    two_dispatchers = [ours.counts(), ours.counts()]
    for n, (endpoint, duration, latency, outcome, exemplar) in enumerate(DELIVERIES):
        counts = two_dispatchers[n % 2]
        counts.attempt("send").inc()
        theirs["attempts"].labels("send").inc()
        counts.duration(endpoint).observe(duration)
        theirs["seconds"].labels(endpoint).observe(duration)
        counts.outcome(endpoint, outcome).inc()
        theirs["outcomes"].labels(endpoint, outcome).inc()
        if latency is not None:
            counts.commit_to_delivery(endpoint).observe(latency, exemplar)
            theirs["latency"].labels(endpoint).observe(latency, exemplar)
    two_dispatchers[1].attempt("lookup").inc()
    theirs["attempts"].labels("lookup").inc()
    assert _steady(render(ours_registry)) == _steady(render(theirs_registry))
    assert ours.outcome_total("delivered") == 6


def test_a_series_is_created_when_first_counted_and_scrapes_its_earliest_time() -> None:
    registry = CollectorRegistry()
    ours = DeliveryMetrics(registry)
    first, second = ours.counts(), ours.counts()
    first.outcome("billing", "retry").inc()
    second.outcome("billing", "retry").inc()
    created = registry.get_sample_value(
        "webhook_poller_delivery_outcomes_created", {"endpoint": "billing", "outcome": "retry"}
    )
    assert created == first.outcome("billing", "retry").created
    assert (
        registry.get_sample_value(
            "webhook_poller_delivery_outcomes_total", {"endpoint": "billing", "outcome": "retry"}
        )
        == 2
    )


def test_endpoints_past_the_limit_count_under_other() -> None:
    """A product's customers' thousands of endpoints would each add about 40 series to
    every scrape (10,000: 35 MB, 3.6 s of CPU): the first ``limit`` names keep their own,
    later ones count together under ``_other``, and the process says it folded."""
    registry = CollectorRegistry()
    deliveries = DeliveryMetrics(registry)
    deliveries.labels.limit = 2
    counts = deliveries.counts()
    for name in ("billing", "shipping", "ledger", "audit", "billing"):
        counts.outcome(name, "delivered").inc()
        counts.duration(name).observe(0.01)
        counts.commit_to_delivery(name).observe(0.02)
    text = generate_latest(registry).decode()
    assert set(re.findall(r'endpoint="([^"]*)"', text)) == {"billing", "shipping", "_other"}
    assert 'outcomes_total{endpoint="_other",outcome="delivered"} 2.0' in text
    assert 'outcomes_total{endpoint="billing",outcome="delivered"} 2.0' in text
    assert deliveries.labels.folded
    assert not DeliveryMetrics(None).labels.folded
    none = dm.EndpointLabels(0)  # POLLER_METRICS_ENDPOINTS=0: no endpoint has its own
    assert (none("billing"), none.folded) == (dm.OTHER, True)
