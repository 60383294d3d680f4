"""The load test's figures, from the database and the receiver — not from the load generator.

``lost`` is a committed order whose webhook the receiver never applied and
that is not visibly ``failed`` either: the number that must be 0. ``wire
duplicates`` are deliveries the receiver saw again (at-least-once at work:
unknown outcomes, reclaimed claims); ``duplicate effects`` are orders whose
effect the receiver applied more than once — 0 whenever receivers dedupe on
``webhook-id`` as the contract asks.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text


def _pct(ordered: list[float], q: float) -> float | None:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def collect(
    engine: Engine,
    receiver_stats: dict[str, Any],
    receipts: dict[str, float],
    duration: float,
    kills: int,
) -> dict[str, Any]:
    """Every figure of the report (JSON-ready)."""
    with engine.connect() as conn:
        orders = conn.execute(text("SELECT count(*) FROM loadtest_orders")).scalar_one()
        rows = conn.execute(
            text(
                "SELECT idempotency_key, status, extract(epoch FROM created_at) AS created, "
                "claimed_by FROM poller_outbox"
            )
        ).all()
        attempts = dict(
            conn.execute(
                text(
                    "SELECT kind || ':' || outcome, count(*) "
                    "FROM poller_delivery_attempts GROUP BY 1"
                )
            ).all()
        )
    status = Counter(r.status for r in rows)
    failed_keys = {r.idempotency_key for r in rows if r.status == "failed"}
    created = {r.idempotency_key: float(r.created) for r in rows}
    lost = [k for k in created if k not in receipts and k not in failed_keys]
    latencies = sorted((receipts[k] - created[k]) * 1000 for k in created if k in receipts)
    times = sorted(receipts[k] for k in created if k in receipts)
    span = (times[-1] - min(created.values())) if times and created else 0.0
    attempt_rows = sum(attempts.values())
    return {
        "orders_committed": orders,
        "messages": len(rows),
        "delivered": status.get("delivered", 0),
        "failed": status.get("failed", 0),
        "lost": len(lost),
        "lost_keys": lost[:20],
        "wire_duplicates": receiver_stats.get("duplicates", 0),
        # Effects the receiver applied beyond one per distinct key.
        "duplicate_effects": receiver_stats.get("applied", 0) - len(receipts),
        "orders_per_second": orders / duration if duration else None,
        "deliveries_per_second": (
            len(times) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None
        ),
        "latency_ms": {
            "p50": _pct(latencies, 0.5),
            "p95": _pct(latencies, 0.95),
            "p99": _pct(latencies, 0.99),
            "mean": statistics.fmean(latencies) if latencies else None,
        },
        "db_rows_per_second": (orders + len(rows) + attempt_rows) / span if span else None,
        "per_poller": dict(Counter(r.claimed_by for r in rows if r.status == "delivered")),
        "attempts": attempts,
        "retries": attempts.get("send:retry", 0) + attempts.get("send:unknown", 0),
        "lookups": sum(v for k, v in attempts.items() if k.startswith("lookup:")),
        "reclaims": attempts.get("send:lease_expired", 0),
        "pollers_killed": kills,
        "receiver": receiver_stats,
        "series": {
            "created": sorted(created.values()),
            "received": times,
            "latency": [
                (receipts[k], (receipts[k] - created[k]) * 1000) for k in created if k in receipts
            ],
        },
    }


def holds(figures: dict[str, Any]) -> list[str]:
    """The invariants; each broken one as a sentence (empty: all hold)."""
    broken = []
    if not figures["orders_committed"]:  # every invariant would hold of nothing
        broken.append("no order was committed: the load never reached the application")
    if figures["lost"]:
        broken.append(f"{figures['lost']} committed orders were never delivered")
    if figures["duplicate_effects"]:
        broken.append(f"{figures['duplicate_effects']} orders took effect more than once")
    if figures["delivered"] + figures["failed"] != figures["orders_committed"]:
        broken.append(
            f"delivered + failed ({figures['delivered']} + {figures['failed']}) "
            f"!= committed ({figures['orders_committed']})"
        )
    return broken


def plot(figures: dict[str, Any], path: Path) -> None:
    """Throughput and latency over time, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = figures["series"]
    start = min(series["created"] or [0.0])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for name, values in (
        ("orders committed/s", series["created"]),
        ("webhooks received/s", series["received"]),
    ):
        per_second = Counter(int(v - start) for v in values)
        xs = sorted(per_second)
        top.plot(xs, [per_second[x] for x in xs], label=name)
    top.set_ylabel("per second")
    top.legend()
    buckets: dict[int, list[float]] = {}
    for received, latency in series["latency"]:
        buckets.setdefault(int(received - start), []).append(latency)
    xs = sorted(buckets)
    bottom.plot(xs, [statistics.median(buckets[x]) for x in xs], label="p50")
    bottom.plot(
        xs, [sorted(buckets[x])[int(0.99 * (len(buckets[x]) - 1))] for x in xs], label="p99"
    )
    bottom.set_ylabel("commit→receipt ms")
    bottom.set_xlabel("seconds since the first order")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(figures: dict[str, Any], out: Path, settings: dict[str, Any]) -> list[str]:
    """report.json, report.md and report.png in ``out``; returns the broken invariants."""
    broken = holds(figures)
    public = {k: v for k, v in figures.items() if k != "series"}
    (out / "report.json").write_text(
        json.dumps({"settings": settings, "figures": public, "invariants_broken": broken}, indent=2)
    )
    plot(figures, out / "report.png")
    lat = figures["latency_ms"]

    def fmt(value: float | None, unit: str = "") -> str:
        return "-" if value is None else f"{value:,.1f}{unit}"

    shares = ", ".join(f"{k}: {v}" for k, v in sorted(figures["per_poller"].items()))
    lines = [
        "# Load test report",
        "",
        "| setting | value |",
        "| --- | --- |",
        *(f"| {k} | {v} |" for k, v in settings.items()),
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| orders committed | {figures['orders_committed']:,} |",
        f"| messages delivered | {figures['delivered']:,} |",
        f"| messages failed (visible, replayable) | {figures['failed']:,} |",
        f"| **lost** (committed, never delivered) | **{figures['lost']}** |",
        f"| wire duplicates (seen again by the receiver) | {figures['wire_duplicates']} |",
        f"| **duplicate effects** (applied twice) | **{figures['duplicate_effects']}** |",
        f"| orders/s | {fmt(figures['orders_per_second'])} |",
        f"| deliveries/s | {fmt(figures['deliveries_per_second'])} |",
        f"| commit→receipt p50 / p95 / p99 | {fmt(lat['p50'], ' ms')} / {fmt(lat['p95'], ' ms')}"
        f" / {fmt(lat['p99'], ' ms')} |",
        f"| DB rows written/s | {fmt(figures['db_rows_per_second'])} |",
        f"| per-poller share | {shares} |",
        f"| retries / lookups / reclaims / pollers killed | {figures['retries']} / "
        f"{figures['lookups']} / {figures['reclaims']} / {figures['pollers_killed']} |",
        "",
        "![throughput and latency](report.png)",
        "",
        "Invariants: "
        + (
            "all hold (lost = 0, duplicate effects = 0, delivered + failed = committed)."
            if not broken
            else "BROKEN — " + "; ".join(broken)
        ),
    ]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return broken
