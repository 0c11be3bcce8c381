"""Subscription records and URIs in free text (offline; through a real gateway:
tests/gateway/mcp_gateway/test_mcp_resource_subscriptions.py and
test_mcp_resource_withholding.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.mcp.access import ToolAccess, ToolVerdict
from gateway.mcp.settings import McpAccessRule, McpGlobs
from gateway.mcp.subscriptions import MAX_URIS, Subscriptions, UriSet, listen_uris
from gateway.mcp.uritext import REDACTED, UriText
from gateway.mcp.withhold import NOT_SUBSCRIBED, TEXT_REFUSED, ResourceSieve, Withheld

UPDATED = "notifications/resources/updated"


def _check(uri: str) -> ToolVerdict:
    if uri.lower().startswith("docs://public/"):
        return ToolVerdict(True, "access[0] allows resource 'docs://public/*'")
    return ToolVerdict(False, f"no access rule lets key k read resource {uri!r} on s")


def _updated(uri: str) -> dict[str, object]:
    return {"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": uri}}


def test_a_set_covers_its_uris_in_normal_form_and_below_them_only() -> None:
    uris = UriSet(["docs://public/a", "DOCS://Public/dir/"])
    assert uris.covers("docs://public/a") and uris.covers("docs://public//a")
    assert uris.covers("docs://public/a/b") and uris.covers("docs://public/dir/x")
    assert not uris.covers("docs://public/ab") and not uris.covers("docs://public/")
    assert not uris.covers("docs://public/a/../b")  # refused outright, never covered
    uris.remove("docs://public/A")  # another path: nothing removed
    assert uris.covers("docs://public/a")
    uris.remove("DOCS://public/a")
    assert not uris.covers("docs://public/a")


def test_sessions_are_kept_apart_ended_and_bounded() -> None:
    subs = Subscriptions(max_sessions=2)
    mine, other = ("k-agent", "docs", "s1"), ("k-other", "docs", "s1")
    subs.add(mine, "docs://public/a")
    assert subs.covers(mine, "docs://public/a")
    assert not subs.covers(other, "docs://public/a") and not subs.covers(None, "docs://x")
    subs.end(mine)
    assert not subs.covers(mine, "docs://public/a") and len(subs) == 0
    for n in range(3):
        subs.add(("k", "docs", f"s{n}"), "docs://public/a")
    assert len(subs) == 2 and not subs.covers(("k", "docs", "s0"), "docs://public/a")
    for n in range(MAX_URIS + 1):
        subs.add(mine, f"docs://public/{n}")
    assert not subs.covers(mine, "docs://public/0") and subs.covers(mine, "docs://public/1")


def test_an_update_needs_both_a_subscription_and_access() -> None:
    subs = Subscriptions(10)
    session = ("k", "docs", "s")
    subs.add(session, "docs://public/a")
    subs.add(session, "docs://secret/b")  # subscribed, then the rules changed
    sieve = ResourceSieve(_check, Withheld(), lambda u: subs.covers(session, u))
    assert sieve.sift(_updated("docs://public/a"), None) is False  # relayed
    assert sieve.sift(_updated("docs://secret/b"), None) is None
    assert sieve.sift(_updated("docs://public/c"), None) is None
    assert sieve.sift({"jsonrpc": "2.0", "method": UPDATED, "params": {}}, None) is None
    assert sieve.sift({"jsonrpc": "2.0", "method": "notifications/resources/list_changed"},
                      None) is False  # not a subscription's: as it was
    assert sieve.withheld.count == 3
    assert sieve.withheld.rules == ["no access rule allows it", NOT_SUBSCRIBED]


def test_a_listen_request_filter_is_its_streams_subscription() -> None:
    params = {"notifications": {"resourceSubscriptions": ["docs://public/a", 7],
                                "resourcesListChanged": True}}
    uris = listen_uris(params)
    assert uris.covers("docs://public/a") and not uris.covers("docs://public/b")
    assert len(listen_uris({"notifications": {}})) == len(listen_uris(None)) == 0


def test_uris_in_strings_are_redacted_only_when_refused() -> None:
    text = UriText(["docs", "file"])
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "result": {
        "content": [{"type": "text", "text": "a docs://public/x, b docs://secret/y; c "
                                             "File:///etc/passwd. d https://example.org/ "
                                             "e docs://{tpl} f mydocs://secret/z"}],
        "structuredContent": {"docs://secret/k": {"deep": [["DOCS://SECRET/q"]]}}}}
    seen: list[str] = []
    count = text.redact(message, _check, lambda uri, reason: seen.append(uri))
    assert count == 4
    assert message["result"]["content"][0]["text"] == (
        f"a docs://public/x, b {REDACTED}; c {REDACTED}. d https://example.org/ "
        "e docs://{tpl} f mydocs://secret/z")
    assert message["result"]["structuredContent"] == {REDACTED: {"deep": [[REDACTED]]}}
    assert "File:///etc/passwd" in seen  # the URI as written goes to the audit digest


@pytest.mark.parametrize("raw", [
    b'{"t":"docs://secret/y"}', b'{"t":"DOCS:x"}', b'{"t":"\\u0064ocs://secret/y"}',
    b'{"t":"docs\\u003a//secret/y"}',
])
def test_the_byte_pre_check_sees_every_spelling_of_a_judged_scheme(raw: bytes) -> None:
    text = UriText(["docs"])
    assert text.may_name(raw)
    message = json.loads(raw)
    text.redact(message, _check, lambda uri, reason: None)
    assert "secret" not in json.dumps(message)


def test_the_pre_check_skips_text_without_a_judged_scheme() -> None:
    assert not UriText(["docs"]).may_name(b'{"t":"see https://example.org/ and notes: x"}')


def test_refuse_mode_turns_a_response_into_an_error_and_drops_a_notification() -> None:
    sieve = ResourceSieve(_check, Withheld(), None, UriText(["docs"]), refuse_text=True)
    response = {"jsonrpc": "2.0", "id": 4, "result": {"content": [
        {"type": "text", "text": "docs://secret/y"}]}}
    assert sieve.sift(response, "tools/call") is True
    assert response == {"jsonrpc": "2.0", "id": 4,
                        "error": {"code": -32001, "message": TEXT_REFUSED}}
    progress = {"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"data": "read docs://secret/y"}}
    assert sieve.sift(progress, "tools/call") is None
    assert sieve.withheld.record() == {
        "count": 2, "rules": ["no access rule allows it"],
        "uri_sha256": sieve.withheld.uri_sha256, "in_text": 2, "refused": 2}


def test_the_judged_schemes_are_those_of_the_callers_rules_for_the_server() -> None:
    access = ToolAccess([
        McpAccessRule(teams=["agents"], servers=["docs"],
                      resources=McpGlobs(allow=["docs://public/*", "*.md"],
                                                  deny=["FILE:///etc/*"])),
        McpAccessRule(teams=["others"], resources=McpGlobs(allow=["https://wiki/*"])),
        McpAccessRule(keys=["k-*"], servers=["other"], resources=McpGlobs(allow=["s3://b/*"])),
    ])
    assert access.resource_schemes("k-1", "agents", "docs") == {"docs", "file"}
    assert access.resource_schemes("k-1", "others", "docs") == {"https"}
    assert access.resource_schemes("k-1", None, "other") == {"s3"}
    assert access.resource_schemes("x", None, "docs") == frozenset()
