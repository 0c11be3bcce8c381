"""Fixes of a tester's findings (2026-12-05), each asserted where it is decided.

* ``file:`` URIs: RFC 8089 spells one local file as ``file:/p``, ``file:///p`` and
  ``file://localhost/p``; a deny glob on one spelling held only against that spelling.
* MCP messages: a byte order mark, UTF-16 and a number overflowing to infinity were taken
  (the arguments' digest was then computed over ``Infinity``), and ``"method": null`` with an
  id passed as a client response.
* Scopes: RFC 6749 separates scope tokens by U+0020 only; NO-BREAK SPACE split them.
* Batch: the output and error files a finished batch stores were not in the audit chain.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from gateway.identity.resources import token_scopes
from gateway.mcp.access import ToolAccess, uri_forms
from gateway.mcp.jsonrpc import McpRefusal, parse_message
from gateway.mcp.settings import McpAccessRule
from tests.gateway.helpers import start_sim
from tests.gateway.test_batch_api import client, jsonl, submit, wait_batch
from tests.gateway.test_batch_audit import audited, records, served


@pytest.mark.parametrize("uri", ["file:/etc/passwd", "file://localhost/etc/passwd",
                                 "file://LOCALHOST/etc/passwd", "FILE:///etc/passwd",
                                 "file:////etc/passwd"])
def test_a_deny_glob_on_a_file_uri_holds_for_every_rfc8089_spelling(uri: str) -> None:
    access = ToolAccess([McpAccessRule(keys=["k"], allow=["*"],
                                       resources={"allow": ["*"], "deny": ["file:///etc/*"]})])
    assert not access.check_resource("k", None, "s", uri).allowed
    assert access.check_resource("k", None, "s", "file:///srv/docs/a.md").allowed
    forms = uri_forms(uri)
    assert forms is not None and "file:///etc/passwd" in forms
    # A remote host is another file: not folded into the local spelling.
    assert uri_forms("file://fileserver/etc/passwd") == ("file://fileserver/etc/passwd",)


@pytest.mark.parametrize("body", [
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"e","arguments":'
    b'{"a":1e999}}}',
    b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"ping"}',
    '{"jsonrpc":"2.0","id":1,"method":"ping"}'.encode("utf-16"),
    b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"\xff"}}',
], ids=["overflowing-float", "bom", "utf-16", "not-utf-8"])
def test_an_mcp_message_is_read_as_strictly_as_a_request_body(body: bytes) -> None:
    with pytest.raises(McpRefusal) as refused:
        parse_message(body)
    assert refused.value.reason == "parse_error"


def test_a_message_with_a_null_method_is_neither_request_nor_response() -> None:
    with pytest.raises(McpRefusal) as refused:
        parse_message(b'{"jsonrpc":"2.0","id":1,"method":null}')
    assert refused.value.reason == "invalid_request"
    assert parse_message(b'{"jsonrpc":"2.0","id":1,"result":{}}').method is None  # a response


def test_scope_tokens_are_separated_by_spaces_only() -> None:
    assert token_scopes({"scope": "files mcp"}) == {"files", "mcp"}
    assert token_scopes({"scope": "files  mcp "}) == {"files", "mcp"}
    assert "mcp" not in token_scopes({"scope": "files\u00a0mcp"})
    assert "mcp" not in token_scopes({"scope": "files\x1fmcp"})
    assert "mcp" not in token_scopes({"scp": ["files\tmcp"]})


def test_a_finished_batchs_output_file_is_in_the_audit_chain(serve_asgi: Any,
                                                            tmp_path: Path) -> None:
    sim = start_sim(serve_asgi)
    gw = served(serve_asgi, audited(sim.url, tmp_path))
    c = client(str(gw.url), "owner")
    b = submit(c, jsonl(2))
    done = wait_batch(c, b.id, lambda b: b.status == "completed")
    assert done.output_file_id is not None
    recs = records(tmp_path)
    [output] = [r for r in recs if r["type"] == "batch.file_created"
                and r["file_id"] == done.output_file_id]
    content = c.files.content(done.output_file_id).content
    assert (output["purpose"], output["batch_id"], output["bytes"], output["sha256"]) == (
        "batch_output", b.id, len(content), hashlib.sha256(content).hexdigest())
    [finished] = [r for r in recs if r["type"] == "batch.finished"]
    assert finished["output_file_id"] == done.output_file_id
    assert finished["error_file_id"] is None
