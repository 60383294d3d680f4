"""Event-type schemas cost time in proportion to the payload
(poller/outbox/json_schemas.py): patterns run on RE2, uniqueItems by hashing."""

from __future__ import annotations

import logging
import time

import pytest

from poller.errors import InvalidInput
from poller.outbox import json_schemas
from poller.outbox.json_schemas import problems

NESTED = "^(a+)+$"  # Python's re took ~75 s for 30 characters, doubling with each one


def test_a_pattern_that_backtracks_checks_a_long_string_at_once() -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": NESTED}},
        "patternProperties": {NESTED: {"type": "integer"}},
        "additionalProperties": False,
    }
    nasty = "a" * 100_000 + "b"
    began = time.monotonic()
    found = problems(schema, {"name": nasty, nasty: 1, "aaa": 2})
    assert time.monotonic() - began < 2
    assert [f.partition(":")[0] for f in found] == ["/", "/name"]  # nasty, as a name too
    assert problems(schema, {"name": "aaa", "aa": 1}) == []
    assert problems(schema, {"aa": "x"}) == ["/aa: 'x' is not of type 'integer'"]


@pytest.mark.parametrize(
    "schema",
    [
        {"pattern": "^(?=a)"},  # lookaround
        {"properties": {"n": {"pattern": r"(a)\1"}}},  # a backreference
        {"properties": {"enum": {"pattern": "(?<=a)b"}}},  # a property named "enum"
        {"patternProperties": {"(?!x)": {}}},
        {"pattern": "(a{1000}){1000}"},  # too large for RE2
        # jsonschema matches these names with re inside unevaluatedProperties
        {"unevaluatedProperties": False, "allOf": [{"patternProperties": {"^a": {}}}]},
    ],
)
def test_a_schema_whose_patterns_cannot_run_in_linear_time_is_refused(
    schema: dict[str, object],
) -> None:
    with pytest.raises(InvalidInput, match="pattern"):
        problems(schema, {})


def test_a_payload_held_in_a_schema_is_no_pattern() -> None:
    schema = {"enum": [{"pattern": "(?=x)"}], "default": {"pattern": "(?=x)"}}
    assert problems(schema, {"pattern": "(?=x)"}) == []


def test_a_stored_schema_re2_cannot_run_is_checked_as_before(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Stored before patterns were checked: its publishes are checked as they were, not
    all refused."""
    schema = {"pattern": "^(?=a)a"}
    with caplog.at_level(logging.WARNING, logger="poller.outbox.json_schemas"):
        assert problems(schema, "ab", stored=True) == []
    assert problems(schema, "b", stored=True) == ["/: 'b' does not match '^(?=a)a'"]
    assert "define the type again" in caplog.text
    with pytest.raises(InvalidInput):
        problems(schema, "ab")


def test_unique_items_checks_a_long_array_of_objects_at_once() -> None:
    """jsonschema compared each object with every one before it: 4,000 took 30 s."""
    schema = {"properties": {"a": {"uniqueItems": True}}}
    items = [{"n": n, "tags": [n, {"ok": True}]} for n in range(20_000)]
    began = time.thread_time()  # CPU, not wall: other processes' load must not count
    assert problems(schema, {"a": items}) == []
    assert problems(schema, {"a": [*items, {"tags": [19_999, {"ok": True}], "n": 19_999.0}]}) == [
        "/a: has non-unique elements (items 19999 and 20000)"
    ]
    assert time.thread_time() - began < 5


@pytest.mark.parametrize(
    ("items", "unique"),
    [
        ([1, 1.0], False),
        ([{"a": 1, "b": 2}, {"b": 2, "a": 1}], False),
        ([{"a": [1]}, {"a": [1.0]}], False),
        ([None, None], False),
        ([True, 1], True),  # JSON's true is no number
        ([[1, True], [1, 1]], True),
        (["1", 1], True),
        ([[], {}], True),
        ([2**53 + 1, float(2**53)], True),  # equal as doubles, not as numbers
    ],
)
def test_unique_items_compares_as_json_schema_does(items: list[object], unique: bool) -> None:
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

    schema = {"uniqueItems": True}
    assert (problems(schema, items) == []) is unique
    assert Draft202012Validator(schema).is_valid(items) is unique  # as jsonschema's own


def test_a_schema_that_rechecks_the_payload_at_every_level_is_cut_short() -> None:
    """anyOf beside unevaluatedProperties, recursive: each level of the payload doubled
    the time (20 levels: minutes); the check stops after STEPS keyword checks."""
    node = {
        "type": "object",
        "anyOf": [
            {"properties": {"a": {"$ref": "#/$defs/node"}}},
            {"properties": {"b": {"$ref": "#/$defs/node"}}},
        ],
        "unevaluatedProperties": False,
    }
    schema = {"$defs": {"node": node}, "$ref": "#/$defs/node"}
    payload: dict[str, object] = {}
    for _ in range(30):
        payload = {"a": payload}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json_schemas, "STEPS", 20_000)  # the same cut, sooner
        assert problems(schema, {"a": {"a": {}}}) == []
        with pytest.raises(InvalidInput, match="20,000 steps"):
            problems(schema, payload)


def test_digits_and_word_characters_are_ascii_as_in_ecma_262() -> None:
    assert problems({"pattern": r"^\d+\w$"}, "123a") == []
    assert problems({"pattern": r"^\d+$"}, "\u0663") != []  # re took an Arabic-Indic 3
    assert problems({"pattern": r"^\p{Nd}+$"}, "\u0663") == []  # as the pattern asks
