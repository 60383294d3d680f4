"""What people type, read once for every face: the CLI, the dashboard, the API.

Each reader takes text (or the already-parsed value, so a face can pass its
defaults through) and returns the value, or raises
:class:`~poller.errors.InvalidInput` with a message that names what was
expected. No face parses these itself: the CLI wraps them in click types
(``poller/cli/output.py``), the dashboard turns the error into a 400 page.

- a **duration** is ``90s``, ``15m``, ``1h``, ``7d``, ``2w`` or plain seconds,
  more than zero and at most 100 years;
- a **time** (``since``/``until``) is a duration ago or an ISO 8601 time; a time
  without a zone is UTC;
- a **row id** (a message's or an event's) is a positive bigint, so an id past
  the column's range is a usage error, never a database error;
- a **JSON payload** is any JSON text, kept exactly as written.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from poller.errors import InvalidInput, InvalidPayload
from poller.rules.payloads import RawJSON, json_problem, loads

ROW_ID_MAX = 2**63 - 1
"""The largest id a row can have (bigint): a larger one names no row, and sent to
PostgreSQL it is an error, not an empty answer."""
MAX_DURATION = timedelta(days=36_525)
"""100 years: the longest duration anything here takes. Longer ones reached past what
PostgreSQL or Python can hold (``--keep-old-for 3000000d`` stored a time in the year
10198 that no reader could load; ``--delivered-older-than`` that far back is out of
PostgreSQL's range) and mean nothing for a webhook anyway."""
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, None: 1}


def duration(value: str | timedelta) -> timedelta:
    """``90s``, ``15m``, ``1h``, ``7d``, ``2w`` or plain seconds → timedelta."""
    if isinstance(value, timedelta):
        return value
    match = _DURATION.match(str(value))
    if not match or not 0 < float(match.group(1)) < math.inf:
        raise InvalidInput(f"{value!r} is not a duration like 90s, 15m, 1h or 7d")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds > MAX_DURATION.total_seconds():
        raise InvalidInput(f"{value!r} is longer than 100 years")
    return timedelta(seconds=seconds)


def is_duration(value: str) -> bool:
    """Whether ``value`` is written as a duration (it may still be out of range)."""
    return bool(_DURATION.match(value))


def moment(value: str | datetime, now: datetime | None = None) -> datetime:
    """A duration ago (``1h``) or an ISO 8601 time → an aware datetime, in UTC."""
    if isinstance(value, datetime):
        return _in_utc(value, value)
    if is_duration(str(value)):
        try:
            return (now or datetime.now(UTC)) - duration(value)
        except OverflowError:
            raise InvalidInput(f"{value!r} ago is before the year 1") from None
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        raise InvalidInput(
            f"{value!r} is neither a duration (1h, 7d) nor an ISO 8601 time"
        ) from None
    return _in_utc(when, value)


def _in_utc(when: datetime, value: object) -> datetime:
    """``when`` in UTC (a time without a zone is UTC already). The years 1 to 9999 are
    a Python datetime's, in UTC too: ``9999-12-31T23:59:59-14:00`` is in the year 10000,
    which PostgreSQL stores and no reader could load back."""
    if when.tzinfo is None:
        return when.replace(tzinfo=UTC)
    try:
        return when.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(f"{value!r} is outside the years 1 to 9999 in UTC") from None


def deadline(value: str | datetime, now: datetime | None = None) -> datetime:
    """A duration from now (``2h``) or an ISO 8601 time, in the future → an aware datetime."""
    now = now or datetime.now(UTC)
    if not isinstance(value, datetime) and is_duration(str(value)):
        try:
            return now + duration(value)
        except OverflowError:
            raise InvalidInput(f"{value!r} from now is after the year 9999") from None
    when = moment(value, now)
    if when <= now:
        raise InvalidInput(f"{value!r} is not in the future")
    return when


def shown(text: str, most: int = 40) -> str:
    """``text`` as an error message quotes it: repr'd, and cut to ``most`` characters (an
    id of 5,000 digits is not worth 5,000 characters of a message)."""
    return repr(text) if len(text) <= most else repr(text[:most]) + f"… ({len(text):,} characters)"


def row_id(value: str | int, what: str = "message") -> int:
    """A message or event id: a whole number from 1 to 2**63-1."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        text = str(value).strip()
        if not text.isascii() or not text.isdigit():
            raise InvalidInput(f"{shown(text)} is not a {what} id (a whole number from 1)")
        if len(text.lstrip("0")) > len(str(ROW_ID_MAX)):  # int() of 4,300 digits raises
            raise InvalidInput(f"{shown(text)} is not a {what} id (from 1 to {ROW_ID_MAX})")
        number = int(text.lstrip("0") or "0")
    if not 0 < number <= ROW_ID_MAX:
        raise InvalidInput(f"{shown(str(value))} is not a {what} id (from 1 to {ROW_ID_MAX})")
    return number


def could_be_row_id(value: int) -> bool:
    """Whether a row can have this id (from 1 to :data:`ROW_ID_MAX`): any other names no
    row, and asking PostgreSQL about it is an error, not an empty answer."""
    return 0 < value <= ROW_ID_MAX


def json_payload(text: str, what: str = "the payload") -> RawJSON:
    """JSON text, checked and kept exactly as written (it is sent as written);
    :class:`~poller.errors.InvalidPayload` if it is not JSON."""
    try:
        loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidPayload(json_problem(what, exc)) from None
    return RawJSON(text)
