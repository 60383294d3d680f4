"""The retry schedule and Retry-After arithmetic. Pure functions, no I/O.

Delays are seconds after the attempt that just failed. The schedule's entry
for attempt ``n`` (1-based) applies after attempt ``n``; past its end the last
interval repeats. Each delay gets ±20 % jitter so a burst of failures does not
come back as a burst.
"""

from __future__ import annotations

import email.utils
import math
import random
from collections.abc import Sequence
from datetime import UTC, datetime

JITTER = 0.2


def backoff(schedule: Sequence[float], attempt: int, rng: random.Random | None = None) -> float:
    """The jittered delay after failed attempt ``attempt`` (1-based)."""
    base = float(schedule[min(max(attempt, 1), len(schedule)) - 1])
    spread = (rng or random).uniform(-JITTER, JITTER)
    return max(0.0, base * (1.0 + spread))


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date); None if absent/invalid."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def retry_delay(
    schedule: Sequence[float],
    attempt: int,
    retry_after: float | None,
    retry_after_cap: float,
    rng: random.Random | None = None,
) -> float:
    """The next delay: the schedule's, but no sooner than a (capped) Retry-After."""
    delay = backoff(schedule, attempt, rng)
    if retry_after is not None:
        delay = max(delay, min(retry_after, retry_after_cap))
    return delay
