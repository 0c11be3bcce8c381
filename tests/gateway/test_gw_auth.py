"""Key authentication: digests only, same error for every failure."""

from __future__ import annotations

import hashlib

import pytest

from gateway.auth import MAX_BEARER_BYTES, KeyRing, KeySettings, bearer_token, digest_key, new_key
from gateway.errors import AuthenticationFailed, error_body


def ring() -> KeyRing:
    return KeyRing([
        KeySettings(id="a", sha256=hashlib.sha256(b"key-a").hexdigest(), models=["m"], team="t"),
        KeySettings(id="b", sha256=hashlib.sha256(b"key-b").hexdigest(), models=["*"]),
    ])


def test_known_keys_map_to_principals() -> None:
    a = ring().authenticate("key-a")
    assert (a.key_id, a.team, a.data_class) == ("a", "t", "internal")
    assert a.may_use("m") and not a.may_use("other")
    assert ring().authenticate("key-b").may_use("anything")


@pytest.mark.parametrize("token", [None, "", "key-c", "key-a ", "KEY-A", "key-a\x00"])
def test_failures_are_indistinguishable(token: str | None) -> None:
    with pytest.raises(AuthenticationFailed) as info:
        ring().authenticate(token)
    reference = AuthenticationFailed()
    assert error_body(info.value) == error_body(reference)
    assert info.value.headers == reference.headers


def test_empty_ring_refuses_everything() -> None:
    with pytest.raises(AuthenticationFailed):
        KeyRing([]).authenticate("anything")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (b"Bearer abc", "abc"),
        (b"bearer abc", "abc"),
        (b"Basic abc", None),
        (b"Bearer", None),
        (b"Bearer ", None),
        (None, None),
        (b"Bearer \xff", None),
        (b"Bearer " + b"x" * 600, "x" * 600),  # a JWT is longer than a key
        (b"Bearer " + b"x" * (MAX_BEARER_BYTES + 1), None),
    ],
)
def test_bearer_parsing(header: bytes | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_new_keys_are_random_and_hash_as_configured() -> None:
    k1, k2 = new_key(), new_key()
    assert k1 != k2 and k1.startswith("sg-") and len(k1) >= 40
    assert digest_key(k1) == hashlib.sha256(k1.encode()).digest()
