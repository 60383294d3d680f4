"""A payload's nesting, read from its JSON text at C speed (poller/rules/payloads.py)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poller.errors import InvalidPayload
from poller.rules import payloads
from poller.rules.payloads import MAX_DEPTH, RawJSON, nesting, serialise_payload

TEXT = st.text(alphabet=st.sampled_from(['"', "\\", "[", "]", "{", "}", "a", "é", "\n", " "]))
JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            stack += [(v, level + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return deepest


@settings(max_examples=300, derandomize=bool(os.environ.get("CI")))
@given(value=JSON, ascii_only=st.booleans(), indent=st.sampled_from([None, 1]))
def test_the_nesting_read_from_the_text_is_the_values(
    value: Any, ascii_only: bool, indent: int | None
) -> None:
    text = json.dumps({"v": value}, ensure_ascii=ascii_only, indent=indent)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(payloads, "MAX_DEPTH", 0)  # never the shortcut: read every text
        assert nesting(text) == _depth({"v": value})


def test_a_payload_nested_past_the_limit_is_refused() -> None:
    text = '{"a": ' * (MAX_DEPTH - 1) + "[]" + "}" * (MAX_DEPTH - 1)  # exactly the limit
    assert serialise_payload(RawJSON(text), 10**6) == text
    deeper = '{"a": ' * MAX_DEPTH + "[]" + "}" * MAX_DEPTH
    with pytest.raises(InvalidPayload, match=f"{MAX_DEPTH + 1} levels deep"):
        serialise_payload(RawJSON(deeper), 10**6)
    with pytest.raises(InvalidPayload, match="levels deep"):
        serialise_payload(json.loads(deeper), 10**6)
    wide = {"items": [{"a": [{"b": "]]]]{{{{"}]} for _ in range(1000)]}  # many brackets
    assert serialise_payload(wide, 10**6)
