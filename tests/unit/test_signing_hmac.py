"""The HMAC signatures (poller/rules/signing.py keys SHA-256 states once per secret) are the
standard library's HMAC-SHA256, for every secret length a key may have."""

from __future__ import annotations

import base64
import hmac

from hypothesis import given, settings
from hypothesis import strategies as st

from poller.rules.signing import SECRET_PREFIX, sign


def _expected(raw: bytes, msg_id: str, stamp: int, body: bytes) -> str:
    mac = hmac.digest(raw, f"{msg_id}.{stamp}.".encode() + body, "sha256")
    return "v1," + base64.b64encode(mac).decode()


@settings(max_examples=60, deadline=None)
@given(
    raws=st.lists(st.binary(min_size=24, max_size=64), min_size=1, max_size=2),
    msg_id=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40),
    stamp=st.integers(min_value=0, max_value=2**40),
    body=st.binary(max_size=2048),
)
def test_a_signature_is_the_standard_hmac_of_id_timestamp_and_body(
    raws: list[bytes], msg_id: str, stamp: int, body: bytes
) -> None:
    keys = [SECRET_PREFIX + base64.b64encode(raw).decode() for raw in raws]
    want = " ".join(_expected(raw, msg_id, stamp, body) for raw in raws)
    assert sign(keys, msg_id, stamp, body) == want
    assert sign(keys, msg_id, stamp, body) == want  # the cached key states stay unchanged
