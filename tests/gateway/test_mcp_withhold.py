"""The resource sieve's byte pre-check and SSE re-framing (offline; the relay through a real
gateway is tests/gateway/mcp_gateway/test_mcp_resource_withholding.py)."""

from __future__ import annotations

import json

import pytest

from gateway.mcp.access import ToolVerdict
from gateway.mcp.sse import SseSplitter, with_data
from gateway.mcp.withhold import PLACEHOLDER, ResourceSieve, Withheld, may_name_uris


def _sieve() -> ResourceSieve:
    def check(uri: str) -> ToolVerdict:
        if uri.startswith("docs://public/"):
            return ToolVerdict(True, "access[0] allows resource 'docs://public/*'")
        return ToolVerdict(False, f"no access rule lets key k do resource {uri!r} on s")

    return ResourceSieve(check, Withheld())


@pytest.mark.parametrize("spelling", [
    b'"uri"', b'"\\u0075ri"', b'"u\\u0072i"', b'"ur\\u0069"', b'"\\u0075\\u0072\\u0069"',
])
def test_every_spelling_of_the_uri_key_is_caught_by_the_pre_check(spelling: bytes) -> None:
    raw = b'{"type":"resource_link",' + spelling + b':"docs://secret/x","name":"x"}'
    item = json.loads(raw)
    assert item["uri"] == "docs://secret/x"  # the escaped key parses as "uri"
    assert may_name_uris(raw)
    message = {"jsonrpc": "2.0", "id": 1, "result": {"content": [item]}}
    sieve = _sieve()
    assert sieve.sift(message, "tools/call") is True
    assert message["result"]["content"] == [{"type": "text", "text": PLACEHOLDER}]
    assert sieve.withheld.record()["rules"] == ["no access rule allows it"]  # no URI in it


def test_text_without_a_uri_key_skips_the_sieve() -> None:
    assert not may_name_uris(b'{"result":{"content":[{"type":"text","text":"uri \\u00e9"}]}}')


def test_a_nested_embedded_resource_is_withheld_and_a_readable_one_kept() -> None:
    message = {"jsonrpc": "2.0", "method": "sampling/createMessage", "id": 3, "params": {
        "messages": [{"role": "user", "content": {"type": "resource", "resource": {
            "uri": "file:///etc/shadow", "text": "root:x"}}},
                     {"role": "user", "content": {"type": "resource_link",
                                                  "uri": "docs://public/a", "name": "a"}}]}}
    sieve = _sieve()
    assert sieve.sift(message, "tools/call") is True
    assert message["params"]["messages"][0]["content"] == {"type": "text", "text": PLACEHOLDER}
    assert message["params"]["messages"][1]["content"]["uri"] == "docs://public/a"
    assert "root:x" not in json.dumps(message)


def test_resource_updated_for_an_unreadable_uri_is_dropped() -> None:
    sieve = _sieve()
    assert sieve.sift({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                       "params": {"uri": "docs://secret/k"}}, None) is None
    assert sieve.sift({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                       "params": {"uri": "docs://public/k"}}, None) is False
    assert sieve.withheld.count == 1


def test_with_data_keeps_the_other_fields_of_the_event() -> None:
    raw = b"event: message\r\nid: 7\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n"
    [event] = SseSplitter(1 << 16).feed(raw)
    out = with_data(event.raw, b'{"a":2}')
    assert out == b'event: message\nid: 7\ndata: {"a":2}\n\n'
    [again] = SseSplitter(1 << 16).feed(out)
    assert again.data == '{"a":2}'
