"""The metrics every delivery counts, kept without prometheus-client's locks.

A delivery updates four series: its exchange (``webhook_poller_attempts_total``),
the exchange's duration, its commit→delivery latency, and its outcome
(``webhook_poller_delivery_outcomes_total``). Through prometheus-client each is a
child whose every update takes a lock, a histogram's two: the four took 5.6 µs
a delivery on the test machine, where plain counts take 0.6.

So each dispatcher counts in a :class:`Counts` of its own, plain numbers that
only its event loop's thread writes, and :class:`DeliveryMetrics`, a collector
in the registry, sums every dispatcher's counts when scraped into the families,
series, buckets, exemplars and ``_created`` samples that prometheus-client's
Counter and Histogram would give (tests/unit/test_delivery_metrics.py holds the
two expositions equal). Counts are per process and only grow: a dispatcher that
ends keeps its counts in the sum.

The ``endpoint`` label is bounded (:class:`EndpointLabels`): the first
``POLLER_METRICS_ENDPOINTS`` endpoint names a process meets keep their own
series, and later ones count under ``endpoint="_other"``. An endpoint costs
about 40 series here; a product whose customers registered 10,000 endpoints made
a 35 MB scrape that took 3.6 s of the poller's CPU, every scrape.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from prometheus_client import metrics as _prometheus_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry
from prometheus_client.samples import Exemplar
from prometheus_client.utils import INF, floatToGoString

from poller.settings import METRICS_ENDPOINTS

_S = TypeVar("_S", "Count", "Histogram")


class Count:
    """One counter series."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self) -> None:
        self.value += 1


class Histogram:
    """One histogram series: a count per bucket (``bounds`` ends with +Inf), the last
    exemplar of each, and the sum."""

    __slots__ = ("bounds", "counts", "created", "exemplars", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.exemplars: dict[int, Exemplar] = {}
        self.created = time.time()

    def observe(self, value: float, exemplar: Mapping[str, str] | None = None) -> None:
        i = bisect.bisect_left(self.bounds, value)  # the first bound >= value: its bucket
        self.counts[i] += 1
        self.sum += value
        if exemplar:
            self.exemplars[i] = Exemplar(dict(exemplar), value, time.time())


class _Family:
    """A family's name (as prometheus-client keeps it), help, type and label names."""

    def __init__(self, name: str, documentation: str, kind: str, labels: tuple[str, ...]) -> None:
        self.name = name.removesuffix("_total") if kind == "counter" else name
        self.documentation, self.kind, self.labels = documentation, kind, labels

    def metric(self) -> Metric:
        return Metric(self.name, self.documentation, self.kind)


OUTCOMES = _Family(
    "webhook_poller_delivery_outcomes_total",
    "Outcomes written: delivered, retry, unknown, failed, released, lookup_retry, ...",
    "counter",
    ("endpoint", "outcome"),
)
ATTEMPTS = _Family(
    "webhook_poller_attempts_total",
    "HTTP exchanges made, by kind (send, lookup).",
    "counter",
    ("kind",),
)
SECONDS = _Family(
    "webhook_poller_delivery_duration_seconds",
    "Duration of one HTTP exchange.",
    "histogram",
    ("endpoint",),
)
LATENCY = _Family(
    "webhook_poller_commit_to_delivery_seconds",
    "From the enqueue transaction to the receiver's 2xx (or found lookup).",
    "histogram",
    ("endpoint",),
)
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, INF)
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600, 86400, INF,
)  # fmt: skip


OTHER = "_other"  # the endpoint label of the endpoints past the limit: no endpoint's name


class EndpointLabels:
    """A process's ``endpoint`` label values: the first ``limit`` names met are their
    own, later ones :data:`OTHER` (and ``folded`` turns true)."""

    def __init__(self, limit: int = METRICS_ENDPOINTS) -> None:
        self.limit = limit
        self.folded = False
        self._own: set[str] = set()

    def __call__(self, name: str) -> str:
        if name in self._own:
            return name
        if len(self._own) < self.limit:
            self._own.add(name)
            return name
        self.folded = True
        return OTHER


class Counts:
    """One dispatcher's counts; only its event loop's thread writes them. Look a series
    up once and keep it: each lookup builds a key."""

    def __init__(self, labels: EndpointLabels | None = None) -> None:
        self.labels = labels or EndpointLabels()
        self.counters: dict[_Family, dict[tuple[str, ...], Count]] = {OUTCOMES: {}, ATTEMPTS: {}}
        self.histograms: dict[_Family, dict[tuple[str, ...], Histogram]] = {
            SECONDS: {}, LATENCY: {}
        }  # fmt: skip

    def attempt(self, kind: str) -> Count:
        return _series(self.counters[ATTEMPTS], (kind,), Count)

    def outcome(self, endpoint: str, outcome: str) -> Count:
        return _series(self.counters[OUTCOMES], (self.labels(endpoint), outcome), Count)

    def duration(self, endpoint: str) -> Histogram:
        key = (self.labels(endpoint),)
        return _series(self.histograms[SECONDS], key, lambda: Histogram(SECONDS_BUCKETS))

    def commit_to_delivery(self, endpoint: str) -> Histogram:
        key = (self.labels(endpoint),)
        return _series(self.histograms[LATENCY], key, lambda: Histogram(LATENCY_BUCKETS))


def _series(table: dict[tuple[str, ...], _S], key: tuple[str, ...], make: Callable[[], _S]) -> _S:
    found = table.get(key)
    if found is None:
        found = table[key] = make()
    return found


class DeliveryMetrics(Collector):
    """The four families, summed over every dispatcher's :class:`Counts` when collected."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.labels = EndpointLabels()  # the process's: its limit set at start (serve())
        self._all: list[Counts] = []
        self._lock = threading.Lock()  # a scrape's thread against a dispatcher starting
        if registry is not None:
            registry.register(self)

    def counts(self) -> Counts:
        """A new dispatcher's counts, summed into every collection from now on."""
        counts = Counts(self.labels)
        with self._lock:
            self._all.append(counts)
        return counts

    def describe(self) -> Iterable[Metric]:
        return [family.metric() for family in (OUTCOMES, ATTEMPTS, SECONDS, LATENCY)]

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            every = list(self._all)
        return [
            _counter(OUTCOMES, every),
            _counter(ATTEMPTS, every),
            _histogram(SECONDS, every),
            _histogram(LATENCY, every),
        ]

    def outcome_total(self, outcome: str) -> float:
        """This process's count of an outcome over every endpoint (the demo)."""
        with self._lock:
            every = list(self._all)
        merged = _merged([counts.counters[OUTCOMES] for counts in every])
        return sum(c.value for (_, name), parts in merged.items() if name == outcome for c in parts)


def _merged(tables: list[dict[tuple[str, ...], _S]]) -> dict[tuple[str, ...], list[_S]]:
    """Each series' parts, one per dispatcher that counted it."""
    merged: dict[tuple[str, ...], list[_S]] = {}
    for table in tables:
        for key, series in list(table.items()):  # a copy: a dispatcher may add to it
            merged.setdefault(key, []).append(series)
    return merged


def _counter(family: _Family, every: list[Counts]) -> Metric:
    metric = family.metric()
    for key, parts in _merged([counts.counters[family] for counts in every]).items():
        labels = dict(zip(family.labels, key, strict=True))
        metric.add_sample(family.name + "_total", labels, sum(c.value for c in parts))
        if _created_samples():
            metric.add_sample(family.name + "_created", labels, min(c.created for c in parts))
    return metric


def _histogram(family: _Family, every: list[Counts]) -> Metric:
    metric = family.metric()
    for key, parts in _merged([counts.histograms[family] for counts in every]).items():
        labels = dict(zip(family.labels, key, strict=True))
        total = 0.0
        for i, bound in enumerate(parts[0].bounds):
            total += sum(h.counts[i] for h in parts)
            exemplars = [h.exemplars[i] for h in parts if i in h.exemplars]
            latest = max(exemplars, key=lambda e: e.timestamp or 0.0) if exemplars else None
            le = {**labels, "le": floatToGoString(bound)}  # type: ignore[no-untyped-call]
            metric.add_sample(family.name + "_bucket", le, total, None, latest)
        metric.add_sample(family.name + "_count", labels, total)
        metric.add_sample(family.name + "_sum", labels, sum(h.sum for h in parts))
        if _created_samples():
            metric.add_sample(family.name + "_created", labels, min(h.created for h in parts))
    return metric


def _created_samples() -> bool:
    """Whether prometheus-client's own metrics give ``_created`` samples (they do unless
    ``PROMETHEUS_DISABLE_CREATED_SERIES`` or ``disable_created_metrics()`` said not)."""
    return bool(getattr(_prometheus_metrics, "_use_created", True))
