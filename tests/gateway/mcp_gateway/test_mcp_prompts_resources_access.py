"""Prompts and resources are under the caller's ``mcp.access`` rules, like tools.

The official ``mcp`` SDK (2.3) as client (both protocol eras) and as upstream server (an
``MCPServer`` with resources, resource templates, prompts and completions) through a real
``gateway serve``. Lists show only what the key may use; a read, a prompt, a completion or a
subscription naming anything else is a JSON-RPC error, audited, and never reaches the server;
a resource URI spelled to slip past a deny glob is refused; a method the gateway does not
govern is refused by default.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import Completion, PromptReference, ResourceTemplateReference

from gateway.mcp.records import name_digest
from tests.gateway.mcp_gateway.harness import Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import META, headers, post
from tests.gateway.mcp_gateway.test_mcp_hostile_round3 import Bodies
from tests.gateway.mcp_gateway.test_mcp_sdk_through_gateway import sdk_client
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

ACCESS = [{"teams": ["agents"], "allow": ["*"],
           "prompts": {"allow": ["summarise"]},
           "resources": {"allow": ["docs://public/*"], "deny": ["docs://public/private-*"]}}]


def docs_server() -> Any:
    """The SDK server: public and secret resources and templates, two prompts, completions."""
    server = MCPServer("upstream-docs")

    @server.tool()
    def echo(text: str) -> str:
        """Echo ``text`` back."""
        return text

    @server.resource("docs://public/readme")
    def readme() -> str:
        return "public readme"

    @server.resource("docs://public/private-notes")
    def private_notes() -> str:
        return "PRIVATE NOTES"

    @server.resource("docs://secret/keys")
    def keys() -> str:
        return "SECRET KEYS"

    @server.resource("docs://public/pages/{name}")
    def page(name: str) -> str:
        return f"page {name}"

    @server.resource("docs://secret/files/{name}")
    def secret_file(name: str) -> str:
        return f"SECRET FILE {name}"

    @server.prompt()
    def summarise(text: str) -> str:
        """Summarise ``text``."""
        return f"Summarise: {text}"

    @server.prompt()
    def leak_secrets() -> str:
        """A prompt the access rules do not allow."""
        return "SECRET PROMPT"

    @server.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> Completion:
        return Completion(values=["SECRET COMPLETION"])

    return server.streamable_http_app()


@pytest.fixture(scope="module")
def docs_stack(serve_asgi_module: Callable[..., Any],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Bodies]]:
    """The gateway in front of :func:`docs_server`, shared by the module's tests.

    Shared because no test changes it: each sends requests with the agent's key and reads
    the audit records and upstream bodies of its own requests only (see ``docs``). The
    gateway keeps no state between requests that the tests assert (no quotas, no budgets;
    every SDK client opens its own session).
    """
    sim = serve_asgi_module(create_sim(SimConfig(models=["m"])))
    bodies = Bodies(docs_server())
    upstream = serve_asgi_module(bodies)

    def extra(mcp: dict[str, Any]) -> None:
        mcp["access"] = ACCESS

    gw = start_gateway(tmp_path_factory.mktemp("docs"), sim.url,
                       {"docs": upstream.url + "/mcp"}, {}, extra)
    try:
        yield gw, bodies
    finally:
        gw.stop()


@pytest.fixture
def docs(docs_stack: tuple[Gateway, Bodies]) -> tuple[Gateway, Bodies]:
    """The shared stack as this test sees it: the audit records it causes and the bodies the
    upstream receives from now on."""
    gw, bodies = docs_stack
    bodies.bodies.clear()
    return gw.from_now(), bodies


def _forwarded(bodies: Bodies) -> list[dict[str, Any]]:
    """The JSON-RPC messages the upstream received (the gateway's own catalogue ones too)."""
    out = []
    for body in bodies.bodies:
        try:
            out.append(json.loads(body))
        except ValueError:
            continue
    return out


def _refusals(gw: Gateway) -> list[dict[str, Any]]:
    """The refusals, but the 405 of the 2025 SDK client's optional standalone GET stream."""
    return [r["data"] for r in gw.records()
            if r["type"] == "mcp.refused" and r["data"]["reason"] != "method_not_allowed"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_lists_show_only_the_prompts_and_resources_the_key_may_use(
        docs: tuple[Gateway, Bodies], mode: str) -> None:
    gw, _ = docs

    async def go() -> dict[str, Any]:
        async with sdk_client(gw.mcp("docs"), "sg-mcp-agent", mode) as client:
            resources = await client.list_resources()
            templates = await client.list_resource_templates()
            prompts = await client.list_prompts()
            read = await client.read_resource("docs://public/readme")
            page = await client.read_resource("docs://public/pages/intro")
            prompt = await client.get_prompt("summarise", {"text": "a report"})
            return {"resources": sorted(str(r.uri) for r in resources.resources),
                    "templates": sorted(t.uri_template for t in templates.resource_templates),
                    "prompts": sorted(p.name for p in prompts.prompts),
                    "read": read.contents[0].text,  # type: ignore[union-attr]
                    "page": page.contents[0].text,  # type: ignore[union-attr]
                    "prompt": prompt.messages[0].content.text}  # type: ignore[union-attr]

    seen = anyio.run(go)
    assert seen["resources"] == ["docs://public/readme"]
    assert seen["templates"] == ["docs://public/pages/{name}"]
    assert seen["prompts"] == ["summarise"]
    assert seen["read"] == "public readme" and seen["page"] == "page intro"
    assert seen["prompt"] == "Summarise: a report"
    # The allowed read and get are audited as well, the URI as a digest only.
    allowed = [r["data"] for r in gw.records() if r["type"] == "mcp.tool_call"]
    reads = [r for r in allowed if r["mcp_method"] == "resources/read"]
    assert [r["resource_sha256"] for r in reads] == [
        hashlib.sha256(u.encode()).hexdigest()
        for u in ("docs://public/readme", "docs://public/pages/intro")]
    assert [r.get("prompt") for r in allowed if r["mcp_method"] == "prompts/get"] == ["summarise"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_denied_reads_prompts_and_completions_are_refused_audited_not_forwarded(
        docs: tuple[Gateway, Bodies], mode: str) -> None:
    gw, bodies = docs

    async def go() -> list[str]:
        errors: list[str] = []
        async with sdk_client(gw.mcp("docs"), "sg-mcp-agent", mode) as client:
            attempts = [
                lambda: client.read_resource("docs://secret/keys"),
                lambda: client.read_resource("docs://public/private-notes"),
                lambda: client.read_resource("docs://secret/files/passwords"),
                lambda: client.get_prompt("leak_secrets"),
                lambda: client.complete(PromptReference(type="ref/prompt", name="leak_secrets"),
                                        {"name": "x", "value": "y"}),
                lambda: client.complete(ResourceTemplateReference(
                    type="ref/resource", uri="docs://secret/files/{name}"),
                    {"name": "name", "value": "p"}),
            ]
            for attempt in attempts:
                try:
                    await attempt()
                except MCPError as exc:
                    errors.append(str(exc))
                else:
                    errors.append("ALLOWED")
        return errors

    errors = anyio.run(go)
    assert "ALLOWED" not in errors, errors
    assert "denies resource 'docs://public/private-*'" in errors[1]
    sent = json.dumps(_forwarded(bodies))
    for leaked in ("docs://secret", "private-notes", "leak_secrets"):
        assert leaked not in sent, leaked
    refusals = _refusals(gw)
    assert [r["reason"] for r in refusals] == ["resource_denied"] * 3 + ["prompt_denied"] * 2 + [
        "resource_denied"]
    assert all(r["status"] == 403 and r["rpc_error"] == -32001 for r in refusals)
    assert refusals[0]["resource_sha256"] == hashlib.sha256(b"docs://secret/keys").hexdigest()
    assert "docs://" not in json.dumps(refusals)  # URIs are recorded as digests only
    # A refused prompt is not known to exist: its name is recorded as a digest only.
    assert [r.get("prompt") for r in refusals[3:5]] == [None] * 2
    assert [r["unknown_names"] for r in refusals[3:5]] == [
        {"prompt": name_digest("leak_secrets")}] * 2


@pytest.mark.parametrize("uri", [
    "DOCS://public/private-notes",                 # the scheme is case-insensitive
    "docs://PUBLIC/private-notes",                 # so is the authority
    "docs://public/%70rivate-notes",               # percent-encoded
    "docs://public/%2570rivate-notes",             # ... twice
    "docs://public//private-notes",                # repeated slash
    "docs://public/readme/../private-notes",       # a dot segment
    "docs://public/%2e%2e/secret/keys",            # an encoded one
    "docs://public/readme\\..\\private-notes",     # a backslash
    "docs://public/readme%00",                     # a control character
])
def test_spellings_of_a_denied_resource_are_refused(docs: tuple[Gateway, Bodies],
                                                     uri: str) -> None:
    gw, bodies = docs
    body = {"jsonrpc": "2.0", "id": 3, "method": "resources/read",
            "params": {"uri": uri, "_meta": META}}
    resp = post(gw.mcp("docs"), body, headers(method="resources/read", name=uri))
    assert resp.status_code == 403, (resp.status_code, resp.text[:300])
    assert resp.json()["error"]["code"] == -32001
    assert not any(m.get("method") == "resources/read" for m in _forwarded(bodies))
    assert [r["reason"] for r in _refusals(gw)] == ["resource_denied"]


def test_a_subscription_to_a_denied_resource_is_refused(docs: tuple[Gateway, Bodies]) -> None:
    gw, bodies = docs
    body = {"jsonrpc": "2.0", "id": 4, "method": "subscriptions/listen",
            "params": {"notifications": {"resourceSubscriptions": [
                "docs://public/readme", "docs://secret/keys"]}, "_meta": META}}
    resp = post(gw.mcp("docs"), body, headers(method="subscriptions/listen"))
    assert resp.status_code == 403, (resp.status_code, resp.text[:300])
    assert not any(m.get("method") == "subscriptions/listen" for m in _forwarded(bodies))
    assert [r["reason"] for r in _refusals(gw)] == ["resource_denied"]


@pytest.mark.parametrize("method, params", [
    ("tasks/list", {}),
    ("tasks/get", {"taskId": "another-callers-task"}),
    ("sampling/createMessage", {"messages": [], "maxTokens": 1}),
    ("vendor/anything", {"x": 1}),
])
def test_methods_the_gateway_does_not_govern_are_refused(docs: tuple[Gateway, Bodies],
                                                         method: str,
                                                         params: dict[str, Any]) -> None:
    gw, bodies = docs
    body = {"jsonrpc": "2.0", "id": 5, "method": method, "params": {**params, "_meta": META}}
    resp = post(gw.mcp("docs"), body, headers(method=method))
    assert resp.status_code == 403, (resp.status_code, resp.text[:300])
    assert resp.json()["error"]["code"] == -32601
    assert not any(m.get("method") == method for m in _forwarded(bodies))
    assert [r["reason"] for r in _refusals(gw)] == ["method_refused"]
