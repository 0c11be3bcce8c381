"""An attacker's try of the MCP endpoint (round 3): each test is one way past a promise of
``docs/mcp.md``, against a real ``gateway serve`` in front of the official SDK's ``MCPServer``
(real uvicorn on loopback), with the upstream counting or recording what it receives."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3

from tests.gateway.identity.jwtkit import SigningKey, identity_section, write_jwks
from tests.gateway.mcp_gateway.harness import Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import META, call, headers, post
from tests.gateway.mcp_gateway.upstreams import request_body, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim


class Bodies:
    """ASGI wrapper keeping every POST body an upstream received (to show what left)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[bytes] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        self.bodies.append(body)
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def methods(self) -> list[str]:
        """The JSON-RPC methods received, in order (``-`` for a message without one)."""
        out = []
        for body in self.bodies:
            try:
                out.append(json.loads(body).get("method", "-"))
            except ValueError:
                out.append("not-json")
        return out


PII = """pii:
  default_class: secret
  default_action: raise
  rules:
    - {id: no-cards, entities: [CREDIT_CARD], action: refuse}
"""
CARD = "4111 1111 1111 1111"


def _stack(serve_asgi: Callable[..., Any], tmp_path: Path, policy_extra: str = "",
           ) -> tuple[Gateway, dict[str, Any]]:
    """The SDK upstream ``tools`` (every body kept), a fetchable ``web`` site, the simulator,
    and the gateway (``fetch_url``'s ``url`` checked), ``policy_extra`` added to the policy."""
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    bodies = Bodies(sdk_server())
    tools = serve_asgi(bodies)
    web = serve_asgi(create_sim(SimConfig(models=["w"])))

    def extra(mcp: dict[str, Any]) -> None:
        mcp["servers"][0]["tools"] = {"fetch_url": {"url_arguments": ["url"]}}
        # Prompts are governed by access rules too: let the agents use them, so that the pii
        # section is what decides about the prompt requests below.
        mcp["access"][0]["prompts"] = {"allow": ["*"]}

    gw = start_gateway(tmp_path, sim.url, {"tools": tools.url + "/mcp"}, {"web": web.port},
                       extra, policy_extra=policy_extra)
    return gw, {"gateway": gw, "upstream": bodies, "tools": tools, "web": web}


def _shared(serve: Callable[..., Any], tmp: Path, policy_extra: str = "",
            ) -> Iterator[dict[str, Any]]:
    gw, parts = _stack(serve, tmp, policy_extra)
    try:
        yield parts
    finally:
        gw.stop()


def _view(parts: dict[str, Any]) -> dict[str, Any]:
    """A shared stack as one test sees it: the records and upstream bodies from now on."""
    parts["upstream"].bodies.clear()
    return {**parts, "gateway": parts["gateway"].from_now()}


# One gateway per module for each (no test changes it: no quotas, each call its own session).
@pytest.fixture(scope="module")
def shared_recorded(serve_asgi_module: Callable[..., Any],
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from _shared(serve_asgi_module, tmp_path_factory.mktemp("recorded"))


@pytest.fixture(scope="module")
def shared_recorded_pii(serve_asgi_module: Callable[..., Any],
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from _shared(serve_asgi_module, tmp_path_factory.mktemp("recorded-pii"), PII)


@pytest.fixture
def recorded(shared_recorded: dict[str, Any]) -> dict[str, Any]:
    """:func:`_stack` without a ``pii`` section."""
    return _view(shared_recorded)


@pytest.fixture
def recorded_pii(shared_recorded_pii: dict[str, Any]) -> dict[str, Any]:
    """:func:`_stack` with a ``pii`` section refusing card numbers."""
    return _view(shared_recorded_pii)


def _refusals(gw: Gateway) -> list[dict[str, Any]]:
    return [r["data"] for r in gw.records() if r["type"] == "mcp.refused"]


def test_url_argument_with_a_backslash_in_the_authority_is_refused(
        recorded: dict[str, Any]) -> None:
    """``http://A\\@B/``: Python's ``urlsplit`` (the gateway's check) reads host B, the policy's
    allowed site; urllib3 (``requests``) and WHATWG parsers (browsers, Node ``fetch``, the usual
    fetch/browse tools) read host A. A URL that parsers read differently must be refused, or a
    tool reaches an address the check never saw."""
    gw, upstream, web, tools = (recorded["gateway"], recorded["upstream"], recorded["web"],
                                recorded["tools"])
    sneaky = [
        f"http://127.0.0.1:{tools.port}\\@127.0.0.1:{web.port}/",   # another loopback port
        f"http://169.254.169.254\\@127.0.0.1:{web.port}/latest/",   # the metadata service
        f"http://169.254.169.254\\\\@127.0.0.1:{web.port}/",
    ]
    # The disagreement is real: the gateway's parser and urllib3's name different hosts.
    assert urllib3.util.parse_url(sneaky[0]).port == tools.port
    assert urllib3.util.parse_url(sneaky[1]).host == "169.254.169.254"
    for target in sneaky:
        resp = post(gw.mcp("tools"), call("fetch_url", {"url": target}),
                    headers(name="fetch_url"))
        assert resp.status_code == 400, (target, resp.status_code, resp.text[:300])
        assert resp.json()["error"]["code"] == -32602
    assert "tools/call" not in upstream.methods()
    assert [r["reason"] for r in _refusals(gw)] == ["url_invalid"] * len(sneaky)


def test_notification_from_a_caller_without_access_is_not_forwarded(
        recorded: dict[str, Any]) -> None:
    """``k-nobody`` (team ``outsiders``) has no ``mcp.access`` rule for ``tools``: its requests
    are refused (``server_denied``), but a notification (no ``id``) carrying any data was
    relayed to the server (202) and not audited."""
    gw, upstream = recorded["gateway"], recorded["upstream"]
    note = {"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": "info", "data": "exfiltrated by a caller with no access",
                       "_meta": META}}
    resp = post(gw.mcp("tools"), note, headers(key="nobody", method="notifications/message"))
    assert resp.status_code == 403, (resp.status_code, resp.text[:300])
    assert upstream.bodies == []
    assert [r["reason"] for r in _refusals(gw)] == ["server_denied"]


@pytest.mark.parametrize("method, params", [
    ("prompts/get", {"name": "summarise", "arguments": {"text": f"card {CARD}"}}),
    ("completion/complete", {"ref": {"type": "ref/prompt", "name": "summarise"},
                             "argument": {"name": "text", "value": f"card {CARD}"}}),
])
def test_sensitive_data_outside_tools_call_is_scanned_before_it_leaves(
        recorded_pii: dict[str, Any], method: str, params: dict[str, Any]) -> None:
    """The ``pii`` section refuses card numbers in a ``tools/call``'s arguments; the same
    number in another request's arguments must not reach the server unscanned and unaudited."""
    gw, upstream = recorded_pii["gateway"], recorded_pii["upstream"]
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**params, "_meta": META}}
    hdrs = headers(method=method, name="summarise" if method == "prompts/get" else None)
    resp = post(gw.mcp("tools"), body, hdrs)
    assert not any(CARD.encode() in b for b in upstream.bodies), resp.text[:300]
    assert resp.status_code == 403, (resp.status_code, resp.text[:300])
    assert [r["reason"] for r in _refusals(gw)] == ["pii_refused"]


def test_identity_routes_hold_on_the_mcp_endpoint(serve_asgi: Callable[..., Any],
                                                   tmp_path: Path) -> None:
    """``identity.routes`` limits ``/mcp/tools`` to API keys: a bearer JWT (valid, mapped to
    the ``agents`` team that may use every tool) is refused there, before anything leaves."""
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    bodies = Bodies(sdk_server())
    tools = serve_asgi(bodies)
    signer = SigningKey("rsa-1")
    jwks = tmp_path / "jwks.json"
    section = identity_section(jwks, write_jwks(jwks, signer))
    section["rules"][0].update(team="agents", models=["m"])
    section["accept"] = ["key", "jwt"]
    section["routes"] = {"/mcp/tools": ["key"]}

    def cfg_extra(cfg: dict[str, Any]) -> None:
        cfg["identity"] = section

    gw = start_gateway(tmp_path, sim.url, {"tools": tools.url + "/mcp"}, {},
                       cfg_extra=cfg_extra)
    try:
        hdrs = {**headers(name="echo"), "authorization": f"Bearer {signer.token()}"}
        resp = post(gw.mcp("tools"), call("echo", {"text": "x"}), hdrs)
        assert resp.status_code == 403, (resp.status_code, resp.text[:300])
        assert upstream_calls(bodies) == []
        assert [r["reason"] for r in _refusals(gw)] == ["credential_not_accepted"]
    finally:
        gw.stop()


def upstream_calls(bodies: Bodies) -> list[str]:
    """The ``tools/call`` requests an upstream received."""
    return [m for m in bodies.methods() if m == "tools/call"]


def test_sensitive_data_in_an_argument_key_is_refused(recorded_pii: dict[str, Any]) -> None:
    """A key of the ``arguments`` object carries data as well as a value does: a card number
    written as a key must meet the ``refuse`` rule before the call leaves."""
    gw, upstream = recorded_pii["gateway"], recorded_pii["upstream"]
    resp = post(gw.mcp("tools"), call("echo", {"text": "hello", CARD: "x"}),
                headers(name="echo"))
    assert not any(CARD.encode() in b for b in upstream.bodies), resp.text[:300]
    assert resp.status_code == 403, (resp.status_code, resp.text[:300])
    assert [r["reason"] for r in _refusals(gw)] == ["pii_refused"]
    # The audit log names the entity, never the key that held it (nor its digits).
    records = json.dumps(gw.records())
    assert "CREDIT_CARD" in records
    assert CARD not in records and CARD.replace(" ", "") not in records


def _odd_answer_server(answers: dict[str, tuple[bytes, bytes]]) -> Any:
    """A raw MCP server (2026-07-28): ``tools/list`` holds ``echo``; a ``tools/call`` of
    ``echo`` is answered with ``answers[params.arguments.text]``: ``(content type, body)``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await request_body(scope, receive, send)
        if body is None:
            return
        req = json.loads(body)
        ctype, out = b"application/json", b""
        if req["method"] == "server/discover":
            out = json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": {
                "supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}}).encode()
        elif req["method"] == "tools/list":
            out = json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": {"tools": [
                {"name": "echo", "inputSchema": {"type": "object"}}]}}).encode()
        else:
            ctype, out = answers[req["params"]["arguments"]["text"]]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", ctype)]})
        await send({"type": "http.response.body", "body": out})

    return app


def test_an_answer_that_is_not_the_response_to_the_call_is_refused(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    """The answer to a ``tools/call`` must be its JSON-RPC response: a batch array (holding
    another request's id), a bare string, an object without ``result``/``error``, or an event
    stream that ends without the response are 502 (or, once the stream has begun, its final
    JSON-RPC error event), audited with the reason, never relayed as the tool's result."""
    other = json.dumps({"jsonrpc": "2.0", "id": "someone-else", "result": {"content": [
        {"type": "text", "text": "another caller's result"}]}})
    note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                       "params": {"level": "info", "data": "x"}})
    answers = {
        "array": (b"application/json", f"[{other}]".encode()),
        "string": (b"application/json", b'"another caller\'s result"'),
        "empty": (b"application/json", b"{}"),
        "sse": (b"text/event-stream", f"event: message\ndata: {note}\n\n".encode()),
    }
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    odd = serve_asgi(_odd_answer_server(answers))
    gw = start_gateway(tmp_path, sim.url, {"odd": odd.url + "/mcp"}, {})
    try:
        for text in answers:
            resp = post(gw.mcp("odd"), call("echo", {"text": text}), headers(name="echo"))
            assert "another caller" not in resp.text, (text, resp.text[:300])
            if text == "sse":
                assert resp.status_code == 200
                last = [ln for ln in resp.text.splitlines() if ln.startswith("data: ")][-1]
                assert json.loads(last[6:])["error"]["code"] == -32002, (text, resp.text)
            else:
                assert resp.status_code == 502, (text, resp.status_code, resp.text[:300])
                assert resp.json()["error"]["code"] == -32002
        reasons = [r["data"]["reason"] for r in gw.records() if r["type"] == "mcp.tool_call"]
        assert reasons == ["upstream_invalid"] * len(answers), reasons
    finally:
        gw.stop()
