"""How a payload is checked against an event type's JSON Schema (2020-12), at a cost
that grows with the payload and not faster: the check runs inside ``publish``, in the
application's transaction (poller/outbox/catalog.py keeps the schemas).

**Patterns** (``pattern``, ``patternProperties``, and the names ``additionalProperties``
weighs against them) run on RE2, whose time grows linearly with the string: on Python's
``re`` (and on ECMA-262 engines, which backtrack too) one pattern like ``^(a+)+$`` held
a publish for minutes on a 30-character string, inside the application's transaction.
RE2 has no lookaround and no backreferences, and its ``\\d`` and ``\\w`` are ASCII, as
ECMA-262's are: a schema whose patterns RE2 cannot run is refused, and so is one that
puts ``unevaluatedProperties`` beside ``patternProperties`` (jsonschema matches those
names with ``re`` inside). A stored schema whose patterns RE2 cannot run (defined
before they were checked) keeps being checked with ``re``, with a warning, rather than
refusing every publish of its type. Where both can run a pattern they differ mostly in
``\\d``, ``\\w``, ``\\s`` and ``\\b``, which ``re`` reads as Unicode (``^\\d+$`` took
Arabic-Indic digits; RE2 and ECMA-262 do not, and ``\\p{Nd}`` does), and in ``$``, which
``re`` also matches before a final newline (RE2 and ECMA-262 do not).

**uniqueItems** is checked in linear time too: jsonschema compared each object (or
each item of an array of mixed types) with every one before it, and 4,000 small
objects, 50 KB of payload, took 30 s.

**Steps.** Every keyword's check counts against :data:`STEPS`; past them the payload is
refused. A schema whose composition re-checks the payload at each level of its nesting
grew exponentially with it.

**References** are looked up as jsonschema follows them (:func:`_check_refs`); nothing
is fetched. A schema is compiled once per process and kept (:func:`_validator`, the
:data:`COMPILED` most recent).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

from poller.errors import InvalidInput, SchemaTooCostly

log = logging.getLogger(__name__)

COMPILED = 256  # schemas kept compiled
PATTERNS_KEPT = 1024  # patterns kept compiled
ERRORS_SHOWN = 5
ERRORS_KEPT = 100  # found before the first ERRORS_SHOWN (by path) are chosen


@functools.lru_cache(maxsize=COMPILED)
def _validator(schema_text: str, stored: bool = False) -> Any:
    """The schema (its JSON text, the cache's key), checked and compiled. ``stored``: read
    back for a publish; one whose patterns RE2 cannot run was stored before they were
    checked, and is checked with ``re`` as it was then."""
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
    from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]

    schema = json.loads(schema_text)
    try:
        Draft202012Validator.check_schema(schema, format_checker=_schema_formats())
    except SchemaError as exc:
        raise InvalidInput(f"schema is not a JSON Schema: {exc.message[:300]}") from None
    _check_refs(schema)
    try:
        _check_patterns(schema)
    except InvalidInput as exc:
        if not stored:
            raise
        log.warning(
            "an event type's stored schema is checked with Python's re, whose time can "
            "grow exponentially with a payload's strings (%s); define the type again",
            exc,
        )
        return _linear_validator(patterns=False)(schema)
    return _linear_validator(patterns=True)(schema)


@functools.cache
def _linear_validator(*, patterns: bool) -> Any:
    """Draft 2020-12 with ``uniqueItems`` in linear time (:func:`_unique_items`) and, with
    ``patterns``, every pattern matched by RE2 (:func:`_regex`); each keyword's check
    counts against the payload's :data:`STEPS`."""
    from jsonschema import Draft202012Validator
    from jsonschema.validators import extend  # type: ignore[import-untyped]

    keywords: dict[str, Callable[..., Any]] = {
        **Draft202012Validator.VALIDATORS,
        "uniqueItems": _unique_items,
    }
    if patterns:
        keywords |= {
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
        }
    return extend(Draft202012Validator, {k: _counted(check) for k, check in keywords.items()})


STEPS = 500_000
"""Keyword checks one payload's check may take. At the largest payload
(POLLER_MAX_PAYLOAD_BYTES' default, 256 KiB), 2,000 objects of ten checked fields take
about 65,000; a schema whose composition re-checks the payload at every level of its
nesting (``anyOf`` beside ``unevaluatedProperties``, in a recursive ``$ref``) took
2.2 times as long for each level: 0.8 s for a payload of 12 levels (86 bytes), minutes
for 20. With the limit, that one is refused after about 7 s on a slow machine."""


class _Steps(threading.local):
    left = STEPS


_steps = _Steps()


def _counted(check: Callable[..., Any]) -> Callable[..., Any]:
    def counted(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _steps.left -= 1
        if _steps.left < 0:
            raise SchemaTooCostly
        return check(validator, value, instance, schema)

    return counted


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """As jsonschema's, in linear time: its check compared each object or mixed-type item
    with every one before it, and an array of 4,000 small objects (50 KB) took 30 s."""
    from jsonschema.exceptions import ValidationError

    if not unique or not validator.is_type(instance, "array"):
        return
    seen: dict[Any, int] = {}
    try:
        for index, item in enumerate(instance):
            first = seen.setdefault(_same(item), index)
            if first != index:
                yield ValidationError(f"has non-unique elements (items {first} and {index})")
                return
    except RecursionError:
        yield ValidationError("is nested too deeply to compare its items")


def _same(value: Any) -> Any:
    """A hashable key equal for JSON values that are equal: 1 and 1.0 alike, True and 1
    not, an object's keys in any order."""
    if isinstance(value, bool):
        return (bool, value)
    if isinstance(value, dict):
        return (dict, frozenset((key, _same(item)) for key, item in value.items()))
    if isinstance(value, list):
        return (list, tuple(_same(item) for item in value))
    if isinstance(value, int | float):
        return (float, value)
    return (type(value), value)


@functools.cache
def _schema_formats() -> Any:
    """The formats a schema's own values are checked for, as jsonschema's but ``regex``:
    RE2's syntax is taken too (``\\p{Nd}``, which ``re`` lacks); one only ``re`` reads
    is left to :func:`_check_patterns`, which says why it cannot be used."""
    from jsonschema import Draft202012Validator, FormatChecker

    formats = FormatChecker()
    formats.checkers = {
        **Draft202012Validator.FORMAT_CHECKER.checkers,
        "regex": (_readable_regex, ()),
    }
    return formats


def _readable_regex(value: object) -> bool:
    if not isinstance(value, str):
        return True
    try:
        _regex(value)
    except InvalidInput:
        try:
            re.compile(value)
        except (re.error, RecursionError, OverflowError):
            return False
    return True


@functools.lru_cache(maxsize=PATTERNS_KEPT)
def _regex(pattern: str) -> Any:
    """``pattern`` compiled by RE2; InvalidInput saying why when RE2 cannot run it."""
    import re2  # type: ignore[import-untyped]

    options = re2.Options()
    options.log_errors = False  # else RE2 writes each refusal to stderr
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        why = exc.args[0].decode(errors="replace") if exc.args else "refused"
        raise InvalidInput(
            f"schema: pattern {pattern[:100]!r} cannot be used ({why[:120]}); patterns "
            "run on RE2, in linear time, which has no lookaround or backreferences"
        ) from None


def _check_patterns(schema: dict[str, Any]) -> None:
    """Every pattern of the schema compiles on RE2; no ``unevaluatedProperties`` beside
    ``patternProperties`` (jsonschema matches those names with ``re``)."""
    seen = set()
    for key, value in _keywords(schema):
        if key == "pattern" and isinstance(value, str):
            _regex(value)
        elif key == "patternProperties" and isinstance(value, dict):
            for pattern in value:
                _regex(pattern)
        seen.add(key)
    if {"unevaluatedProperties", "patternProperties"} <= seen:
        raise InvalidInput(
            "schema: unevaluatedProperties cannot be used beside patternProperties (their "
            "names would be matched in exponential time); use additionalProperties"
        )


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = _regex(pattern)
        for name, value in instance.items():
            if regex.search(name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """As jsonschema's, with the names matched against ``patternProperties`` by RE2."""
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    known = schema.get("properties", {})
    patterns = [_regex(p) for p in schema.get("patternProperties", {})]
    extras = sorted(
        (
            name
            for name in instance
            if name not in known and not any(regex.search(name) for regex in patterns)
        ),
        key=str,
    )
    if validator.is_type(extra, "object"):
        for name in extras:
            yield from validator.descend(instance[name], extra, path=name)
    elif extra is False and extras:
        names = ", ".join(repr(name) for name in extras)
        verb = "was" if len(extras) == 1 else "were"
        if patterns:
            regexes = ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            yield ValidationError(f"{names} {verb} not matched by any of the patterns {regexes}")
        else:
            yield ValidationError(
                f"Additional properties are not allowed ({names} {verb} unexpected)"
            )


def _check_refs(schema: dict[str, Any]) -> None:
    """Every ``$ref`` points at something the schema holds (a pointer, an ``$anchor``, a
    resource it embeds under an ``$id``), looked up as jsonschema will: from the base
    its nearest ``$id`` sets. Nothing is fetched (jsonschema follows no URL), so any
    other one failed every payload's check with jsonschema's own error: each publish
    of the type raised an untyped exception."""
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012

    if not any(key in ("$ref", "$dynamicRef") for key, _ in _keywords(schema)):
        return  # nothing to follow (nor an $id to read)
    root = DRAFT202012.create_resource(schema)
    try:
        registry = Registry().with_resource(root.id() or "", root).crawl()
        _follow(schema, registry.resolver_with_root(root))
    except ValueError as exc:  # urllib's, for an $id that is no URI: InvalidInput is one too
        if isinstance(exc, InvalidInput):
            raise
        raise InvalidInput(f"schema: an $id is not a URI ({str(exc)[:100]})") from None


def _follow(node: Any, resolver: Any, named: bool = False) -> None:
    """:func:`_check_refs` for ``node``, ``resolver`` at its base (see :func:`_keywords`
    for ``named``)."""
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    if isinstance(node, list):
        for item in node:
            _follow(item, resolver)
        return
    if not isinstance(node, dict):
        return
    if named:
        for value in node.values():
            _follow(value, resolver)
        return
    if isinstance(node.get("$id"), str):
        resolver = resolver.in_subresource(DRAFT202012.create_resource(node))
    for key, value in node.items():
        if key in ("$ref", "$dynamicRef") and isinstance(value, str):
            try:
                resolver.lookup(value)
            except Unresolvable:
                raise InvalidInput(
                    f"schema: {key} {value[:100]!r} points at nothing the schema holds "
                    "(#/$defs/name, an $anchor, an embedded $id); nothing is fetched"
                ) from None
        elif key not in _VALUES:
            _follow(value, resolver, key in _NAMED)


_VALUES = frozenset({"const", "enum", "default", "examples"})  # hold payloads, not schemas
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _keywords(node: Any, named: bool = False) -> Iterator[tuple[str, Any]]:
    """Every keyword of the schema and its subschemas, as (key, value): not inside the
    keywords that hold payloads (an ``enum`` of objects with a ``pattern`` key holds no
    pattern); ``named``: ``node`` maps names to subschemas (``properties``)."""
    if isinstance(node, list):
        for item in node:
            yield from _keywords(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if named:  # a property called "enum" is a subschema
                yield from _keywords(value)
                continue
            yield key, value
            if key not in _VALUES:
                yield from _keywords(value, key in _NAMED)


def problems(schema: dict[str, Any] | str, payload: Any, *, stored: bool = False) -> list[str]:
    """Where and why ``payload`` does not match ``schema`` (the first few); none: it does.
    ``stored``: the schema as the catalog holds it (see :func:`_validator`)."""
    from referencing.exceptions import Unresolvable  # jsonschema's, imported with it

    text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
    validator = _validator(text, stored)
    _steps.left = STEPS
    try:
        errors = list(itertools.islice(validator.iter_errors(payload), ERRORS_KEPT))
    except Unresolvable as exc:  # stored before references were checked (_check_refs)
        raise InvalidInput(f"the schema cannot be followed: {str(exc)[:200]}") from None
    except RecursionError:  # {"$ref": "#"}, or a payload nested as deep as Python goes
        raise InvalidInput(
            "the schema cannot be followed this deep: its references go round without "
            "end, or the payload is nested too deeply"
        ) from None
    except ValueError as exc:  # urllib's, for a stored $id that is no URI (_check_refs)
        raise InvalidInput(f"the schema cannot be followed: {str(exc)[:200]}") from None
    except SchemaTooCostly:
        raise InvalidInput(
            f"checking the payload took more than {STEPS:,} steps: the schema re-checks "
            "parts of it many times over (anyOf or oneOf beside unevaluatedProperties, "
            "nested): simplify it"
        ) from None
    found = []
    for error in sorted(errors, key=lambda e: list(e.path))[:ERRORS_SHOWN]:
        where = "/" + "/".join(str(p) for p in error.path)
        found.append(f"{where}: {error.message[:200]}")
    return found
