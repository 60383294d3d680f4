"""Payloads: what an application may enqueue, and the exact JSON text it becomes.

The text :func:`serialise_payload` returns is stored (a ``json`` column) and
sent as the body byte for byte: key order, number spellings and UTF-8 text
arrive as produced. A payload is a JSON object — a ``dict``, a pydantic
model, a dataclass — or :class:`RawJSON` text kept exactly as given; values
JSON has no type for are encoded by :func:`encode_value` (docs/how-to/enqueue.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

from poller.errors import EnqueueError, InvalidPayload, NaiveDatetime, PayloadTooLarge

JsonDefault = Callable[[Any], Any]

MAX_DEPTH = 127
"""How deeply a payload's arrays and objects may nest: as deep as serde_json reads by
default (its limit of 128 counts down to 0 at the 128th level), so a Rust receiver can
read it. Deeper ones broke the poller's own views of a message (the API's and ``admin
show --json``: a RecursionError, at about 900 levels)."""
# A payload's UTF-8 cut to its quotes and brackets (a multi-byte character holds no
# ASCII byte), objects' braces read as brackets: in valid JSON each closes what it
# opened, so the nesting is the same
_QUOTES_AND_BRACKETS = bytes.maketrans(b"{}", b"[]")
_CUT = bytes(b for b in range(256) if b not in b'"[]{}')

# JSON text of a NUL character, not preceded by an escaping backslash:
# PostgreSQL's jsonb cannot store it.
_JSON_NUL_RE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# JSON text of a surrogate (\ud800-\udfff), escaped: alone, jsonb refuses it too.
_JSON_SURROGATE_RE = re.compile(r"(?<!\\)(?:\\\\)*\\u[dD][89a-fA-F]")


def _not_a_number(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def _number(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # PostgreSQL's jsonb refuses 1e999999; most receivers read inf
        raise ValueError(f"{text[:24]} is beyond the range of a JSON number (about 1.8e308)")
    return value


def _integer(text: str) -> int:
    most = sys.get_int_max_str_digits()
    if most and len(text.lstrip("-")) > most:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (at most {most})")
    return int(text)


def loads(text: str | bytes | bytearray) -> Any:
    """JSON text as it can be stored and sent (ValueError, saying why, if not): Python's
    ``json.loads`` takes ``NaN`` and ``Infinity``, which JSON has not and a ``json``
    column refuses; a number past a double's range (RFC 8259's interoperable one),
    which ``jsonb`` may refuse (a publish reads the payload as jsonb) and receivers
    read as infinity; an integer longer than Python reads; and nesting past
    :data:`MAX_DEPTH` (said in those words, before Python's parser runs out of stack)."""
    if (
        depth := nesting(text if isinstance(text, str) else bytes(text).decode("utf-8", "replace"))
    ) > MAX_DEPTH:
        raise ValueError(f"nests {depth} levels deep; at most {MAX_DEPTH}")
    return json.loads(text, parse_constant=_not_a_number, parse_float=_number, parse_int=_integer)


def json_problem(what: str, error: Exception) -> str:
    """What to say of text :func:`loads` refused: not JSON, or JSON it cannot take."""
    if isinstance(error, json.JSONDecodeError | RecursionError):
        return f"{what} is not JSON: {error}"
    return f"{what}: {error}"


@dataclass(frozen=True, slots=True)
class RawJSON:
    """A payload your code already serialized: its text is checked (a JSON object,
    no NUL escape, within the size limit) and then stored and sent exactly as given.

    ``enqueue(..., payload=RawJSON(request_body.decode()))``
    """

    text: str


def _raw_json(raw: RawJSON) -> str:
    if not isinstance(raw.text, str):
        raise InvalidPayload("RawJSON takes the JSON text as a str")
    try:
        value = loads(raw.text)
    except (ValueError, RecursionError) as exc:
        raise InvalidPayload(json_problem("RawJSON", exc)) from None
    if not isinstance(value, dict):
        raise InvalidPayload(f"payload must be a JSON object, not {type(value).__name__}")
    if _JSON_SURROGATE_RE.search(raw.text):  # a pair is a character; one alone is not
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidPayload(
                "payload contains a lone surrogate (an escape in \\ud800-\\udfff without "
                "its pair), which is not valid UTF-8"
            ) from None
    return raw.text


def encode_value(value: Any) -> Any:
    """How values JSON has no type for are sent — stable, documented (docs/how-to/enqueue.md):

    ====================================  ==========================================
    value                                 JSON
    ====================================  ==========================================
    aware ``datetime``                    ISO 8601 with its offset, ``"2026-11-30T09:00:00+00:00"``
    naive ``datetime``                    refused (``NaiveDatetime``): no instant
    ``date`` / ``time``                   ISO 8601, ``"2026-11-30"`` / ``"09:00:00"``
    ``Decimal``                           a string of its exact digits, ``"12.50"``
    ``UUID``                              a string, ``"7d4e…"``
    ``Enum``                              its value (encoded in turn)
    pydantic model                        ``model_dump()`` (its own serializers apply)
    dataclass instance                    its fields as an object
    anything else                         refused (``InvalidPayload``)
    ====================================  ==========================================
    """
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise NaiveDatetime(
                f"payload holds a naive datetime ({value.isoformat()}): give it a timezone"
            )
        return value.isoformat()
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise InvalidPayload(f"payload holds a non-finite Decimal ({value})")
        return str(value)
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Enum):
        return value.value
    model_dump = getattr(value, "model_dump", None)  # pydantic v2, without importing it
    if callable(model_dump) and not isinstance(value, type):
        return model_dump()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _encoder(json_default: JsonDefault | None) -> JsonDefault:
    if json_default is None:
        return encode_value

    def chained(value: Any) -> Any:
        try:
            return json_default(value)
        except TypeError:
            return encode_value(value)

    return chained


def _dumps(payload: Any, json_default: JsonDefault | None) -> str:
    default = _encoder(json_default)
    try:
        top = payload if isinstance(payload, Mapping) else default(payload)
    except TypeError:
        top = payload
    if not isinstance(top, Mapping):
        raise InvalidPayload(
            f"payload must be a JSON object (a dict, pydantic model or dataclass), "
            f"not {type(payload).__name__}"
        )
    try:
        return json.dumps(
            top, allow_nan=False, separators=(",", ":"), ensure_ascii=False, default=default
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, EnqueueError):
            raise
        raise InvalidPayload(f"payload is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidPayload(
            "payload is nested too deeply to encode (deeper than Python's recursion limit)"
        ) from None


def serialise_payload(payload: Any, max_bytes: int, json_default: JsonDefault | None = None) -> str:
    """The payload as compact JSON text — the exact bytes receivers will get.

    The payload must be a JSON object: a ``dict`` (or anything
    :func:`encode_value` turns into one: a pydantic model, a dataclass), or
    :class:`RawJSON` text, which is kept exactly as given.
    Keys keep their order, numbers their spelling (``1.0`` stays ``1.0``),
    non-ASCII text is sent as UTF-8. ``json_default`` encodes other values
    first (like ``json.dumps(default=…)``); raising TypeError hands a value on
    to the built-in encoding. Raises InvalidPayload, PayloadTooLarge or
    NaiveDatetime.
    """
    body = _raw_json(payload) if isinstance(payload, RawJSON) else _dumps(payload, json_default)
    if _JSON_NUL_RE.search(body):
        raise InvalidPayload("payload contains a NUL character (\\u0000), which is not stored")
    size = len(body.encode("utf-8", errors="surrogatepass"))
    if size > max_bytes:
        raise PayloadTooLarge(
            f"payload is {size} bytes as JSON; the limit is {max_bytes} (POLLER_MAX_PAYLOAD_BYTES)"
        )
    try:
        body.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPayload(
            "payload contains a lone surrogate, which is not valid UTF-8"
        ) from None
    if (depth := nesting(body)) > MAX_DEPTH:
        raise InvalidPayload(
            f"payload nests {depth} levels deep; at most {MAX_DEPTH}, as deep as serde_json "
            "reads by default: a receiver's parser may stop there"
        )
    return body


def stored_payload(text: str | None) -> Any:
    """A stored payload (its ``json`` column's text) as a view shows it: its value, or
    the text itself when no value can be made of it safely — nested deeper than
    :data:`MAX_DEPTH`, or holding an integer longer than Python reads. Enqueue refuses
    both; a row written before it checked the nesting, or by SQL, may hold them, and
    reading it as a value raised RecursionError (past about 900 levels) in every view
    of its message and its event."""
    if text is None or nesting(text) > MAX_DEPTH:
        return text
    try:
        return json.loads(text)
    except ValueError:  # an integer past Python's digits; PostgreSQL's json takes it
        return text


def nesting(text: str) -> int:
    """How deeply the JSON ``text``'s arrays and objects nest, 0 when it has too few
    brackets to nest past :data:`MAX_DEPTH` (nearly every payload). Its escapes are
    cut, then all but quotes and brackets, then its strings, then the innermost pairs
    a level at a time (at C speed: 4 to 8 ms for 414 KB of 8,000 objects in an array), and
    past :data:`MAX_DEPTH` levels what is left is counted in one pass."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0
    bare = text.replace("\\\\", "").replace('\\"', "")  # no quote is left in an escape
    kept = bare.encode("utf-8", "surrogatepass").translate(_QUOTES_AND_BRACKETS, _CUT)
    brackets = b"".join(kept.split(b'"')[::2])
    depth = 0
    while depth <= MAX_DEPTH:  # the innermost pairs, a level at a time, at C speed
        peeled = brackets.replace(b"[]", b"")
        if len(peeled) == len(brackets):
            return depth
        brackets, depth = peeled, depth + 1
    # Deeper still: the rest in one pass, '[' (91) opening a level and ']' (93) closing
    # one (peeling on was quadratic: 50 s for a body nested 100,000 deep).
    return depth + max(itertools.accumulate(92 - b for b in brackets), default=0)
