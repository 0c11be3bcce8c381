"""Unit tests of the MCP framing, access globs and caller-bound sessions (no I/O)."""

from __future__ import annotations

import base64

import pytest

from gateway.mcp.access import ToolAccess
from gateway.mcp.jsonrpc import McpRefusal, check_headers, parse_message
from gateway.mcp.sessions import SessionBinder
from gateway.mcp.settings import McpAccessRule
from gateway.mcp.sse import SseSplitter

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
CALL = (b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_weather",'
        b'"arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}')
MODERN = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call",
          "mcp-name": "get_weather"}


def refusal(body: bytes, headers: dict[str, str]) -> McpRefusal:
    with pytest.raises(McpRefusal) as exc:
        check_headers(parse_message(body), headers)
    return exc.value


def test_modern_call_with_matching_headers_passes() -> None:
    assert check_headers(parse_message(CALL), MODERN) == "2026-07-28"
    sentinel = "=?base64?" + base64.b64encode(b"get_weather").decode() + "?="
    assert check_headers(parse_message(CALL), {**MODERN, "mcp-name": sentinel}) == "2026-07-28"


@pytest.mark.parametrize(("headers", "needle"), [
    ({**MODERN, "mcp-method": "tools/list"}, "Mcp-Method header 'tools/list'"),
    ({**MODERN, "mcp-name": "other"}, "Mcp-Name header does not match"),
    ({**MODERN, "mcp-name": "=?base64?!!!?="}, "invalid base64"),
    ({k: v for k, v in MODERN.items() if k != "mcp-name"}, "Mcp-Name header is required"),
    ({k: v for k, v in MODERN.items() if k != "mcp-method"}, "Mcp-Method header is required"),
])
def test_header_body_mismatch_is_32020(headers: dict[str, str], needle: str) -> None:
    err = refusal(CALL, headers)
    assert (err.status, err.rpc_code, err.reason) == (400, -32020, "header_mismatch")
    assert needle in err.message


def test_meta_version_must_match_the_header() -> None:
    body = CALL.replace(b'"2026-07-28"}}}', b'"2025-11-25"}}}')
    assert refusal(body, MODERN).rpc_code == -32020


def test_unknown_version_is_32022_listing_supported() -> None:
    err = refusal(CALL, {**MODERN, "mcp-protocol-version": "2030-01-01"})
    assert err.rpc_code == -32022 and "2026-07-28" in err.data["supported"]


def test_handshake_era_request_may_omit_headers_but_not_contradict_them() -> None:
    legacy = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"}}'
    assert check_headers(parse_message(legacy), {}) == "2025-03-26"
    assert refusal(legacy, {"mcp-name": "b"}).reason == "header_mismatch"


@pytest.mark.parametrize(("body", "reason"), [
    (b"[" + b",".join([CALL] * 3) + b"]", "batch_refused"),
    (b"  \n[]", "batch_refused"),
    (b"{nope", "parse_error"),
    (b'{"jsonrpc":"1.0","id":1,"method":"x"}', "invalid_request"),
    (b'{"jsonrpc":"2.0","id":true,"method":"x"}', "invalid_request"),
    (b'{"jsonrpc":"2.0","id":null,"method":"tools/list"}', "invalid_request"),
    (b'{"jsonrpc":"2.0","id":1,"method":"a","method":"b"}', "duplicate_key"),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":1}}', "invalid_params"),
])
def test_malformed_bodies_are_refused(body: bytes, reason: str) -> None:
    with pytest.raises(McpRefusal) as exc:
        parse_message(body)
    assert exc.value.reason == reason and exc.value.status == 400


def test_access_deny_wins_and_unmatched_callers_get_nothing() -> None:
    access = ToolAccess([
        McpAccessRule(teams=["agents"], servers=["search*"], allow=["*"], deny=["delete_*"]),
        McpAccessRule(keys=["k-ops"], servers=["*"], allow=["delete_cache"]),
    ])
    assert access.check("k-1", "agents", "search-eu", "fetch").allowed
    assert not access.check("k-1", "agents", "search-eu", "delete_all").allowed
    assert not access.check("k-1", "agents", "files", "fetch").allowed
    assert not access.check("k-2", "others", "search-eu", "fetch").allowed
    # k-ops in team agents: the agents rule's deny still wins over k-ops' allow.
    verdict = access.check("k-ops", "agents", "search-eu", "delete_cache")
    assert not verdict.allowed and "access[0] denies 'delete_*'" in verdict.reason
    assert access.check("k-ops", None, "files", "delete_cache").allowed


def test_session_ids_are_bound_to_caller_and_server() -> None:
    binder = SessionBinder()
    sid = binder.wrap("k-a", "tools", "upstream-123")
    assert binder.unwrap("k-a", "tools", sid) == "upstream-123"
    assert binder.unwrap("k-b", "tools", sid) is None
    assert binder.unwrap("k-a", "files", sid) is None
    assert binder.unwrap("k-a", "tools", "upstream-123") is None
    _, _, tag = sid.partition(".")
    other = binder.wrap("k-a", "tools", "upstream-456").partition(".")[0]
    assert binder.unwrap("k-a", "tools", f"{other}.{tag}") is None
    assert SessionBinder().unwrap("k-a", "tools", sid) is None  # another process's key


def test_sse_splitter_relays_whole_events_and_bounds_them() -> None:
    split = SseSplitter(max_event_bytes=64)
    assert split.feed(b"event: message\ndata: {\"a\"") == []
    events = split.feed(b":1}\n\n: keep-alive\r\n\r\ndata: x\n")
    assert [e.data for e in events] == ['{"a":1}', None]
    assert events[0].raw == b"event: message\ndata: {\"a\":1}\n\n"
    with pytest.raises(ValueError, match="longer than 64"):
        split.feed(b"y" * 100)


def test_request_headers_one_pass_finds_repeats_and_param_lines() -> None:
    """Known and other names, any case: the last line wins, every name sent twice is in
    ``repeated`` (a known routing header too), ``Mcp-Param-*`` lines kept in order with
    repeats; a request without repeats has none."""
    from gateway.mcp.asgi import request_headers

    h = request_headers([
        (b"mcp-method", b"tools/call"), (b"X-Custom", b"1"), (b"mcp-param-region", b"eu"),
        (b"x-custom", b"2"), (b"Mcp-Param-Region", b"us"), (b"MCP-METHOD", b"tools/list"),
        (b"authorization", b"Bearer a"), (b"mcp-param-zone", b"=?base64?eg==?=")])
    assert h["mcp-method"] == "tools/list" and h["x-custom"] == "2"
    assert h["mcp-param-region"] == "us" and h["authorization"] == "Bearer a"
    assert h.repeated == {"mcp-method", "x-custom", "mcp-param-region"}
    assert h.params == [("mcp-param-region", "eu"), ("mcp-param-region", "us"),
                        ("mcp-param-zone", "=?base64?eg==?=")]
    single = request_headers([(b"host", b"h"), (b"mcp-name", b"echo"), (b"x-a", b"1")])
    assert single.repeated == set() and single.params == [] and single["mcp-name"] == "echo"
