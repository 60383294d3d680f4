"""Retry schedule and Retry-After arithmetic (pure)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from hypothesis import given
from hypothesis import strategies as st

from poller.rules.retry import JITTER, MAX_DELAY, backoff, parse_retry_after, retry_delay

SCHEDULE = (5.0, 300.0, 1800.0)


@given(st.integers(min_value=1, max_value=50), st.integers())
def test_backoff_stays_within_jitter_of_the_schedule(attempt: int, seed: int) -> None:
    base = SCHEDULE[min(attempt, len(SCHEDULE)) - 1]
    delay = backoff(SCHEDULE, attempt, random.Random(seed))
    assert base * (1 - JITTER) <= delay <= base * (1 + JITTER)


def test_jitter_spreads_a_burst() -> None:
    rng = random.Random(1)
    delays = {round(backoff(SCHEDULE, 1, rng), 3) for _ in range(100)}
    assert len(delays) > 90 and min(delays) < 4.5 and max(delays) > 5.5


def test_last_interval_repeats() -> None:
    rng = random.Random(0)
    assert 1440 <= backoff(SCHEDULE, 9, rng) <= 2160


def test_retry_after_seconds_and_http_date() -> None:
    now = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(format_datetime(now + timedelta(seconds=90), usegmt=True), now) == 90
    assert parse_retry_after(format_datetime(now - timedelta(hours=1), usegmt=True), now) == 0
    for bad in (None, "", "soon", "-5", "1.5e9x", "²", "٣", "1e9", "+5", "5 s", "Infinity"):
        assert parse_retry_after(bad) is None


def test_retry_after_from_a_hostile_receiver_is_bounded() -> None:
    assert parse_retry_after("9" * 60) == MAX_DELAY  # 60 digits: finite, then capped
    assert parse_retry_after("9" * 400) is None  # longer than any honest header
    assert parse_retry_after("Fri, 31 Dec 99999 23:59:59 GMT") is None
    assert parse_retry_after("Mon, 32 Foo 2026 25:61:61 GMT") is None


@given(st.text(max_size=80))
def test_retry_after_never_raises_and_is_finite(value: str) -> None:
    seconds = parse_retry_after(value)
    assert seconds is None or 0 <= seconds <= MAX_DELAY


def test_retry_after_is_a_floor_and_is_capped() -> None:
    rng = random.Random(0)
    assert 60.0 <= retry_delay((1.0,), 1, 60.0, 3600.0, rng) <= 72.0  # no sooner than asked
    capped = {retry_delay((1.0,), 1, 10**9, 3600.0, rng) for _ in range(50)}
    assert min(capped) >= 3600.0 and max(capped) <= 4320.0  # not for ever...
    assert len(capped) > 40  # ...and a capped burst is spread out too
    assert retry_delay((100.0,), 1, 1.0, 3600.0, rng) >= 80.0  # the schedule still applies
