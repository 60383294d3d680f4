"""The retry schedule and Retry-After arithmetic. Pure functions, no I/O.

Delays are seconds after the attempt that just failed. The schedule's entry
for attempt ``n`` (1-based) applies after attempt ``n``; past its end the last
interval repeats. Each delay gets ±20 % jitter so a burst of failures does not
come back as a burst; a receiver's ``Retry-After`` is a floor, so it gets
jitter upwards only (0 to +20 %), capped or not.

``Retry-After`` is read strictly (RFC 9110 §10.2.3): ASCII digits
(delta-seconds) or an HTTP-date. Anything else — ``²``, ``-5``, ``1e9``,
``٣`` — is ignored, never raised: a receiver controls this header.
"""

from __future__ import annotations

import email.utils
import math
import random
from collections.abc import Sequence
from datetime import UTC, datetime

JITTER = 0.2
MAX_HEADER = 64  # longer than any valid Retry-After; longer values are ignored unread
MAX_DELAY = 365 * 86400.0  # a delay beyond this is treated as this (and then capped)


def backoff(schedule: Sequence[float], attempt: int, rng: random.Random | None = None) -> float:
    """The jittered delay after failed attempt ``attempt`` (1-based)."""
    base = float(schedule[min(max(attempt, 1), len(schedule)) - 1])
    spread = (rng or random).uniform(-JITTER, JITTER)
    return max(0.0, base * (1.0 + spread))


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date); None if absent/invalid.

    Never raises, whatever the receiver sent; the result is finite, 0 to MAX_DELAY.
    """
    if value is None or len(value) > MAX_HEADER or not value.isascii():
        return None
    value = value.strip(" \t")
    if value.isdigit():  # ASCII only (checked above): '²'.isdigit() is True, float('²') raises
        return min(float(int(value)), MAX_DELAY)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    except OverflowError:
        return None
    return min(max(0.0, seconds), MAX_DELAY) if math.isfinite(seconds) else None


def retry_delay(
    schedule: Sequence[float],
    attempt: int,
    retry_after: float | None,
    retry_after_cap: float,
    rng: random.Random | None = None,
) -> float:
    """The next delay: the schedule's, but no sooner than a (capped, jittered) Retry-After."""
    delay = backoff(schedule, attempt, rng)
    if retry_after is not None:
        floor = min(retry_after, retry_after_cap) * (1.0 + (rng or random).uniform(0.0, JITTER))
        delay = max(delay, floor)
    return delay


MAX_SCHEDULE_LENGTH = 50
MAX_INTERVAL = 30 * 86400.0  # as POLLER_RETRY_SCHEDULE: each interval at most 30 days


def check_schedule(schedule: object, what: str = "retry_schedule") -> tuple[float, ...]:
    """A retry schedule: 1 to 50 intervals in seconds, each more than 0 and at most 30
    days (the last repeats), or InvalidEndpoint naming ``what``."""
    from poller.errors import InvalidEndpoint

    if isinstance(schedule, str | bytes) or not isinstance(schedule, Sequence) or not schedule:
        raise InvalidEndpoint(f"{what} must list 1 to {MAX_SCHEDULE_LENGTH} intervals in seconds")
    if len(schedule) > MAX_SCHEDULE_LENGTH:
        raise InvalidEndpoint(f"{what} may list at most {MAX_SCHEDULE_LENGTH} intervals")
    checked = []
    for value in schedule:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidEndpoint(f"{what}: {value!r} is not a number of seconds")
        if not (math.isfinite(value) and 0 < value <= MAX_INTERVAL):
            raise InvalidEndpoint(f"{what}: each interval is more than 0 s and at most 30 days")
        checked.append(float(value))
    return tuple(checked)
