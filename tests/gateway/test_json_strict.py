"""Request bodies: RFC 8259 or 400 ``invalid_json`` with the position; no body yields a 500."""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest

from gateway.relay.rewrite import MAX_DEPTH
from tests.gateway.helpers import KEY_A, Sim

AUTH = {"authorization": f"Bearer {KEY_A}", "content-type": "application/json"}
HEAD = b'{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hi"}],"x":'


def _post(url: str, body: bytes) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", content=body, headers=AUTH, timeout=30)


@pytest.mark.parametrize(
    ("value", "what"),
    [
        (b"1" * 5000, "integer with too many digits"),
        (b"-" + b"9" * 4301, "integer with too many digits"),
        (b"NaN", "NaN is not valid JSON"),
        (b"Infinity", "Infinity is not valid JSON"),
        (b"[1, -Infinity]", "-Infinity is not valid JSON"),
        (b'{"a": {"b": NaN}}', "NaN is not valid JSON"),
        (b"1e999", "out of range"),
        (b'"\\ud800"', "unpaired UTF-16 surrogate"),
        (b'["ok", "\\udc00x"]', "unpaired UTF-16 surrogate"),
    ],
)
def test_values_outside_rfc8259_are_refused_with_position(
    gateway_url: str, sim: Sim, value: bytes, what: str
) -> None:
    before = sim.stats()["received"]
    r = _post(gateway_url, HEAD + value + b"}")
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_json"
    assert what in err["message"]
    assert f"(char {len(HEAD)})" in err["message"], err["message"]
    assert sim.stats()["received"] == before


def test_nesting_is_limited_to_max_depth(gateway_url: str, sim: Sim) -> None:
    ok = HEAD + b"[" * (MAX_DEPTH - 1) + b"1" + b"]" * (MAX_DEPTH - 1) + b',"max_tokens":2}'
    assert _post(gateway_url, ok).status_code == 200  # the top-level object is level 1
    deep = HEAD + b"[" * MAX_DEPTH + b"1" + b"]" * MAX_DEPTH + b"}"
    r = _post(gateway_url, deep)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_json" and f"deeper than {MAX_DEPTH}" in err["message"]
    assert f"(char {len(HEAD)})" in err["message"]


def test_byte_order_mark_and_deep_nesting_are_400(gateway_url: str) -> None:
    r = _post(gateway_url, b"\xef\xbb\xbf" + HEAD + b"1}")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert "byte order mark" in r.json()["error"]["message"]
    deep = HEAD + b"[" * 200_000 + b"]" * 200_000 + b"}"
    r = _post(gateway_url, deep)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_valid_edge_values_still_pass(gateway_url: str, sim: Sim) -> None:
    body = HEAD + b'{"big": ' + b"9" * 4300 + b', "pair": "\\ud83d\\ude00", "tiny": 1e-400, '
    body += b'"dup": 1, "dup": 2, "escaped": "\\\\ud800"}, "max_tokens": 2}'
    r = _post(gateway_url, body)
    assert r.status_code == 200, r.text
    assert sim.stats()["last_body"]["x"]["dup"] == 2


def _shapes(rng: random.Random) -> list[bytes]:
    """Generated body shapes: structure, numbers, strings, encodings, truncation."""
    atoms = [b"0", b"-0", b"1e308", b"1e309", b"-1e-999", b"1" * 4301, b"1" * 4300, b"NaN",
             b"-Infinity", b"true", b"null", b'""', b'"\\ud800"', b'"\\udfff\\ud800"',
             b'"\\u0000"', b'"\xff"', b"\xed\xa0\x80", b'"\\x"', b"01", b"1.", b".5", b"+1",
             b"[]", b"{}", b'{"model": 1}', b'"' + b"a" * 10_000 + b'"', b"\x00", b"'a'"]
    keys = [b'"model"', b'"stream"', b'"stream_options"', b'"x"', b'"y"', b'"\\ud800"',
            b'""', b"model", b'"user"']
    out: list[bytes] = []
    base = b'"model":"llama-3.1-8b","max_tokens":2,"messages":[{"role":"user","content":"hi"}]'
    for atom in atoms:  # every atom at least once in an otherwise valid request
        for depth in (0, 1, 30):
            value = atom
            for level in range(depth):
                value = b"[" + value + b"]" if level % 2 else b'{"k":' + value + b"}"
            out.append(b"{" + base + b',"x":' + value + b"}")
    for _ in range(150):
        depth = rng.choice([0, 1, 5, 50, 5000])
        value = rng.choice(atoms)
        for _ in range(depth):
            value = rng.choice([b"[" + value + b"]", b'{"k":' + value + b"}"])
        members = [b'"model":"llama-3.1-8b"', b'"max_tokens":2',
                   b'"messages":[{"role":"user","content":"hi"}]'] if rng.random() < 0.7 else []
        for _ in range(rng.choice([0, 0, 1, 2])):
            members.append(rng.choice(keys) + b":" + value)
        rng.shuffle(members)
        body = b"{" + b",".join(members) + b"}"
        mutation = rng.random()
        if mutation < 0.1:
            body = body[: rng.randint(0, len(body))]
        elif mutation < 0.15:
            body = b"\xef\xbb\xbf" + body
        elif mutation < 0.2:
            body = body.decode("latin-1").encode("utf-16")
        elif mutation < 0.25:
            body = rng.choice(atoms)
        out.append(body)
    return out


def test_no_body_shape_yields_a_500(gateway_url: str) -> None:
    rng = random.Random(8259)  # noqa: S311  (test data, not secrets)
    statuses: dict[int, int] = {}
    with httpx.Client(timeout=30) as http:
        for body in _shapes(rng):
            r = http.post(gateway_url + "/v1/chat/completions", content=body, headers=AUTH)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code < 500, (body[:200], r.status_code, r.text[:300])
            if r.status_code >= 400:
                err: dict[str, Any] = r.json()["error"]
                assert set(err) == {"message", "type", "param", "code"}, err
    assert statuses.get(400, 0) > 30 and statuses.get(200, 0) > 5, statuses


def test_nesting_near_the_interpreter_limit_never_yields_a_500(gateway_url: str) -> None:
    """Depths around the recursion limit, where parsing may pass and re-serialising not."""
    with httpx.Client(timeout=30) as http:
        for depth in range(850, 1030, 3):
            nested = b"[" * depth + b'"\\ud800"' + b"]" * depth
            for body in (
                HEAD + nested + b"}",
                b'{"model":"llama-3.1-8b","stream":true,"messages":[{"role":"user",'
                b'"content":"hi"}],"stream_options":{"x":' + b"[" * depth + b"1"
                + b"]" * depth + b"}}",
            ):
                r = http.post(gateway_url + "/v1/chat/completions", content=body, headers=AUTH)
                assert r.status_code < 500, (depth, r.text[:300])
