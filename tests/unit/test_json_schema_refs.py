"""An event type's $refs are looked up as jsonschema will (poller/outbox/json_schemas.py)."""

from __future__ import annotations

import pytest

from poller.errors import InvalidInput
from poller.outbox.json_schemas import problems

BUNDLED = {  # a schema with a resource of its own: its refs are relative to its $id
    "$id": "https://schemas.example/order",
    "properties": {"price": {"$ref": "money"}},
    "$defs": {
        "money": {
            "$id": "money",
            "properties": {"cents": {"$ref": "#/$defs/cents"}},
            "$defs": {"cents": {"type": "integer"}},
        }
    },
}


def test_a_bundled_schema_is_followed_from_each_resource() -> None:
    """Looked up from the root, ``#/$defs/cents`` and ``money`` were refused."""
    assert problems(BUNDLED, {"price": {"cents": 5}}) == []
    assert problems(BUNDLED, {"price": {"cents": "5"}}) == [
        "/price/cents: '5' is not of type 'integer'"
    ]
    no_root_id = {key: value for key, value in BUNDLED.items() if key != "$id"}
    assert problems(no_root_id, {"price": {"cents": "5"}}) != []


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "https://schemas.example/elsewhere"},  # nothing is fetched
        {**BUNDLED, "properties": {"price": {"$ref": "money#/$defs/dollars"}}},
        {"$id": "http://[::1", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {}}},
    ],
)
def test_a_ref_to_nothing_the_schema_holds_is_refused(schema: dict[str, object]) -> None:
    with pytest.raises(InvalidInput, match="schema: "):
        problems(schema, {})


def test_a_property_called_ref_or_id_is_no_reference() -> None:
    schema = {"properties": {"$ref": {"type": "string"}, "$id": {"const": "http://[::1"}}}
    assert problems(schema, {"$ref": "#/nowhere", "$id": "http://[::1"}) == []
