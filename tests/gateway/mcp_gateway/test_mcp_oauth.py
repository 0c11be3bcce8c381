"""The MCP endpoints as OAuth 2.1 protected resources, with real parts: panva's
``oidc-provider`` (npm) mints client-credentials JWT access tokens for the resource a client
names (RFC 8707), a real ``gateway serve`` fronts two MCP servers (the official SDK's
``MCPServer``) and the official SDK client calls them with a token.

What must hold (MCP authorization, 2025-06-18 and later): a token is accepted at
``/mcp/<name>`` only when issued for that endpoint's canonical URI, the ``resource`` of its
RFC 9728 document; a token for the chat API, another server or the aggregate is refused 401
with the challenge; a token lacking a scope is refused 403 ``insufficient_scope`` naming the
scopes needed; the client's token never reaches an upstream, which sees only the gateway's
credential from its Secret; each call's audit record names the verified identity.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.audit.pseudonym import load_pseudonymizer
from gateway.identity.auth import subject_pseudonym
from gateway.mcp.records import name_digest
from tests.gateway.identity.test_oidc_provider import Provider
from tests.gateway.mcp_gateway.harness import KEYS, Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import META
from tests.gateway.mcp_gateway.upstreams import Recording, notes_server, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

UPSTREAM_TOKEN = "upstream-token-of-the-tools-secret"  # noqa: S105 - a test value
WELL_KNOWN = "/.well-known/oauth-protected-resource"


def _signing_jwk() -> dict[str, Any]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk: dict[str, Any] = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
    return {**jwk, "kid": "mcp-key", "use": "sig", "alg": "RS256"}


def mint(provider: Provider, resource: str, scope: str, client: str = "ci-bot") -> str:
    """A client-credentials access token for ``resource`` (RFC 8707) with ``scope``."""
    r = httpx.post(provider.issuer + "/token", timeout=10,
                   data={"grant_type": "client_credentials", "scope": scope,
                         "resource": resource},
                   auth=(client, f"{client}-secret-of-the-test"))
    assert r.status_code == 200, r.text
    token = str(r.json()["access_token"])
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["aud"] == resource, claims  # what the provider minted, before the gateway
    return token


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[Provider]:
    """The OpenID provider, stopped at teardown whatever happened after it started."""
    p = Provider(tmp_path)
    yield p
    p.stop()


@pytest.fixture(params=[False])
def oauth(serve_asgi: Callable[..., Any], tmp_path: Path, provider: Provider,
          request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The provider, two recorded upstreams (``tools`` with a Secret, ``notes``) and the
    gateway: issuer audience ``urn:sovereign-gateway`` (the chat API), aggregate on; with the
    parameter ``True``, scope ``mcp:tools`` required everywhere and ``mcp:admin`` for the
    ``count`` tool."""
    scoped: bool = request.param
    provider.start(_signing_jwk())
    jwks = tmp_path / "idp-jwks.json"
    jwks.write_bytes(provider.public_jwks())
    pin = hashlib.sha256(jwks.read_bytes()).hexdigest()
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    tools, notes = Recording(sdk_server()), Recording(notes_server())
    secret = tmp_path / "tools-token"
    secret.write_text(UPSTREAM_TOKEN + "\n")

    def mcp_extra(mcp: dict[str, Any]) -> None:
        mcp["servers"][0]["auth_token_file"] = str(secret)
        mcp["aggregate"] = True
        mcp["resource_metadata"]["authorization_servers"] = [provider.issuer]
        if scoped:
            mcp["servers"][0]["tools"] = {"count": {"scopes": ["mcp:admin"]}}
            mcp["resource_metadata"]["required_scopes"] = ["mcp:tools"]

    def cfg_extra(cfg: dict[str, Any]) -> None:
        cfg["identity"] = {
            "issuers": [{"issuer": provider.issuer, "audiences": ["urn:sovereign-gateway"],
                         "algorithms": ["RS256"], "jwks_file": str(jwks), "jwks_sha256": pin}],
            "rules": [{"id": "bots", "match": {"groups": "ml-engineers"}, "team": "agents",
                       "models": ["m"]}],
        }

    gw = start_gateway(tmp_path, sim.url, {"tools": serve_asgi(tools).url + "/mcp",
                                           "notes": serve_asgi(notes).url + "/mcp"},
                       {}, mcp_extra, cfg_extra=cfg_extra)
    try:
        yield {"gateway": gw, "provider": provider, "tools": tools, "notes": notes}
    finally:
        gw.stop()


def _sdk(url: str, token: str, steps: Callable[[Client], Any]) -> Any:
    """Run ``steps`` with the official SDK client sending ``Authorization: Bearer token``."""

    async def go() -> Any:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                      timeout=httpx2.Timeout(30.0)) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                return await steps(client)

    return anyio.run(go)


def _post(url: str, token: str, method: str = "tools/list",
          tool: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"_meta": META}}
    hdrs = {"mcp-protocol-version": "2026-07-28", "mcp-method": method,
            "accept": "application/json, text/event-stream", "content-type": "application/json"}
    if token:
        hdrs["authorization"] = f"Bearer {token}"
    if tool is not None:
        body["params"].update(name=tool, arguments={"steps": 1} if "count" in tool else {})
        hdrs["mcp-name"] = tool
    return httpx.post(url, json=body, headers=hdrs, timeout=30)


def _tool_calls(upstream: Recording) -> int:
    return sum(1 for _, h in upstream.requests if h.get("mcp-method") == "tools/call")


def test_tokens_are_accepted_only_at_the_resource_they_were_issued_for(
        oauth: dict[str, Any]) -> None:
    gw: Gateway = oauth["gateway"]
    provider: Provider = oauth["provider"]
    tools: Recording = oauth["tools"]

    # Discovery as a client does it: the document's resource is the endpoint's own URL.
    meta = httpx.get(gw.url + WELL_KNOWN + "/mcp/tools", timeout=10).json()
    assert meta["resource"] == gw.mcp("tools")
    assert meta["authorization_servers"] == [provider.issuer]
    assert "scopes_supported" not in meta  # none configured
    assert httpx.get(gw.url + WELL_KNOWN + "/mcp", timeout=10).json()["resource"] == (
        gw.url + "/mcp")

    for_tools = mint(provider, meta["resource"], "mcp:tools")

    async def steps(client: Client) -> str:
        assert "echo" in {t.name for t in (await client.list_tools()).tools}
        result = await client.call_tool("echo", {"text": "bound"})
        return str(result.content[0].text)  # type: ignore[union-attr]

    assert _sdk(gw.mcp("tools"), for_tools, steps) == "bound"

    # Tokens issued for other resources: the chat API, the other server, the aggregate.
    for_chat = mint(provider, "urn:sovereign-gateway", "chat mcp:tools")
    for_notes = mint(provider, gw.mcp("notes"), "mcp:tools")
    for_aggregate = mint(provider, gw.url + "/mcp", "mcp:tools")
    calls_before = _tool_calls(tools)
    challenge = (f'Bearer error="invalid_token", '
                 f'resource_metadata="{gw.url}{WELL_KNOWN}/mcp/tools"')
    for token in (for_chat, for_notes, for_aggregate):
        refused = _post(gw.mcp("tools"), token, "tools/call", "echo")
        assert refused.status_code == 401, refused.text
        assert refused.headers["www-authenticate"] == challenge
        assert gw.mcp("tools") in refused.json()["error"]["message"]
    assert _tool_calls(tools) == calls_before  # nothing forwarded

    # Each is good where it was meant to go.
    assert _post(gw.mcp("notes"), for_notes).status_code == 200
    assert _post(gw.url + "/mcp", for_aggregate).status_code == 200
    assert _post(gw.url + "/mcp", for_tools).status_code == 401
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(gw.url + "/v1/chat/completions", json=chat, timeout=30, headers={
        "authorization": f"Bearer {for_chat}"}).status_code == 200
    wrong = httpx.post(gw.url + "/v1/chat/completions", json=chat, timeout=30, headers={
        "authorization": f"Bearer {for_tools}"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "token_audience_invalid"

    # The upstream saw the gateway's credential only, never a client token.
    assert tools.requests
    for method, hdrs in tools.requests:
        assert hdrs.get("authorization") == f"Bearer {UPSTREAM_TOKEN}", (method, hdrs)
        assert not any(t in v for v in hdrs.values()
                       for t in (for_tools, for_chat, for_notes, for_aggregate))
    assert all("authorization" not in h for _, h in oauth["notes"].requests)

    # The audit log: the call names who made it (pseudonymised), the refusals why.
    records = gw.records()
    pseudo = load_pseudonymizer(Path(gw.cfg["audit"]["pseudonym_key_file"]))
    calls = [r["data"] for r in records if r["type"] == "mcp.tool_call"
             and r["data"].get("tool") == "echo"]
    assert len(calls) == 1
    identity = calls[0]["identity"]
    assert identity["issuer"] == provider.issuer
    assert identity["subject"] == subject_pseudonym(pseudo, provider.issuer, "ci-bot")
    assert identity["scopes"] == ["mcp:tools"] and identity["rule"] == "bots"
    assert calls[0]["key_id"].startswith("id:")
    refused = [r["data"] for r in records if r["type"] == "mcp.refused"]
    assert [r["reason"] for r in refused] == ["token_audience_invalid"] * 4
    for r in refused:  # verified, then refused for its audience: still says who
        assert r["identity"]["issuer"] == provider.issuer
        assert r["identity"]["subject"] == identity["subject"] and r["identity"]["rule"] is None
    assert "ci-bot" not in json.dumps(records) and for_tools not in json.dumps(records)


@pytest.mark.parametrize("oauth", [True], indirect=True)
def test_missing_scopes_get_the_insufficient_scope_challenge(oauth: dict[str, Any]) -> None:
    gw: Gateway = oauth["gateway"]
    provider: Provider = oauth["provider"]
    tools: Recording = oauth["tools"]
    metadata = f'resource_metadata="{gw.url}{WELL_KNOWN}/mcp/tools"'
    meta = httpx.get(gw.url + WELL_KNOWN + "/mcp/tools", timeout=10).json()
    assert meta["scopes_supported"] == ["mcp:tools", "mcp:admin"]
    no_token = _post(gw.mcp("tools"), "")
    assert no_token.status_code == 401  # no credential: no error code, the scopes named
    assert no_token.headers["www-authenticate"] == f'Bearer scope="mcp:tools", {metadata}'

    chat_only = mint(provider, gw.mcp("tools"), "chat")
    refused = _post(gw.mcp("tools"), chat_only)
    assert refused.status_code == 403, refused.text
    assert refused.headers["www-authenticate"] == (
        'Bearer error="insufficient_scope", error_description="the token lacks scope '
        f'mcp:tools", scope="mcp:tools", {metadata}')
    assert refused.json()["error"]["data"] == {"required_scopes": ["mcp:tools"],
                                               "missing_scopes": ["mcp:tools"]}

    # A tool with a scope of its own: the challenge names every scope the call needs.
    user = mint(provider, gw.mcp("tools"), "mcp:tools")
    calls_before = _tool_calls(tools)
    step_up = _post(gw.mcp("tools"), user, "tools/call", "count")
    assert step_up.status_code == 403, step_up.text
    assert 'scope="mcp:tools mcp:admin"' in step_up.headers["www-authenticate"]
    assert _tool_calls(tools) == calls_before
    aggregate_user = mint(provider, gw.url + "/mcp", "mcp:tools")
    via_aggregate = _post(gw.url + "/mcp", aggregate_user, "tools/call", "tools__count")
    assert via_aggregate.status_code == 403
    assert via_aggregate.headers["www-authenticate"] == (
        'Bearer error="insufficient_scope", error_description="the token lacks scope '
        f'mcp:admin", scope="mcp:tools mcp:admin", {metadata}')
    assert _tool_calls(tools) == calls_before

    # Stepped up: a token with both scopes calls it through the SDK client.
    admin = mint(provider, gw.mcp("tools"), "mcp:tools mcp:admin")

    async def steps(client: Client) -> bool:
        result = await client.call_tool("count", {"steps": 2})
        return bool(result.is_error)

    assert _sdk(gw.mcp("tools"), admin, steps) is False
    assert _tool_calls(tools) == calls_before + 1
    # API keys carry no scopes: access rules decide for them, unchanged.
    assert _post(gw.mcp("tools"), KEYS["agent"], "tools/call", "count").status_code == 200

    refusals = [r["data"] for r in gw.records() if r["type"] == "mcp.refused"]
    assert [r["reason"] for r in refusals] == ["missing_credential"] + ["insufficient_scope"] * 3
    assert "identity" not in refusals[0]  # no credential: nobody to name
    refusals = refusals[1:]
    assert all(r["identity"]["issuer"] == provider.issuer for r in refusals)
    # Refused before the tool catalogue was read: the tool is named by its digest only.
    assert refusals[1]["unknown_names"] == {"tool": name_digest("count")}
    assert refusals[1]["identity"]["scopes"] == ["mcp:tools"]


class _Memory:
    """The SDK's token storage, in memory (:class:`mcp.client.auth.TokenStorage`)."""

    def __init__(self) -> None:
        self.tokens: Any = None
        self.client: Any = None

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client

    async def set_client_info(self, client_info: Any) -> None:
        self.client = client_info


@pytest.mark.parametrize("oauth", [True], indirect=True)
def test_the_sdk_discovers_authorises_and_steps_up_by_itself(oauth: dict[str, Any]) -> None:
    """The official SDK's OAuth client (client credentials, no token given): the 401 leads it
    to the RFC 9728 document, from there to the provider, whose token it requests for the
    resource the document names with the scope the challenge names; the 403 of a tool that
    needs more makes it ask again with both scopes. The gateway never saw a token it did not
    bind to ``/mcp/tools``, and the upstream none at all."""
    from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider

    gw: Gateway = oauth["gateway"]
    provider: Provider = oauth["provider"]
    tools: Recording = oauth["tools"]
    storage = _Memory()
    sdk_oauth = ClientCredentialsOAuthProvider(
        server_url=gw.mcp("tools"), storage=storage, client_id="ci-bot",
        client_secret="ci-bot-secret-of-the-test", issuer=provider.issuer)  # noqa: S106

    async def go() -> tuple[str, bool, str]:
        async with httpx2.AsyncClient(auth=sdk_oauth, timeout=httpx2.Timeout(30.0)) as http:
            async with Client(streamable_http_client(gw.mcp("tools"), http_client=http)) as c:
                echo = await c.call_tool("echo", {"text": "discovered"})
                first = str(storage.tokens.scope)
                count = await c.call_tool("count", {"steps": 1})
                return str(echo.content[0].text), bool(count.is_error), first  # type: ignore[union-attr]

    text, failed, first_scope = anyio.run(go)
    assert (text, failed) == ("discovered", False)
    assert first_scope == "mcp:tools"  # from the 401's scope, then stepped up
    token = storage.tokens.access_token
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["aud"] == gw.mcp("tools")
    assert set(claims["scope"].split()) == {"mcp:tools", "mcp:admin"}
    reasons = [r["data"]["reason"] for r in gw.records() if r["type"] == "mcp.refused"]
    assert "insufficient_scope" in reasons and "token_audience_invalid" not in reasons
    for _, hdrs in tools.requests:
        assert hdrs.get("authorization") == f"Bearer {UPSTREAM_TOKEN}"
