"""``identity.routes`` on the MCP endpoints: a route limiting ``/mcp/tools`` to API keys holds
for every spelling of that path and for the aggregate ``/mcp`` calling that server's tools.

A real ``gateway serve`` (subprocess) in front of two official-SDK MCP servers on loopback,
a bearer JWT signed by a real RSA key and verified against a pinned JWKS file; each upstream
records what it received, so a refusal is also shown to have sent nothing."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.identity.jwtkit import SigningKey, identity_section, write_jwks
from tests.gateway.mcp_gateway.harness import Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import META, call, headers, post
from tests.gateway.mcp_gateway.upstreams import Counting, notes_server, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture
def routed(serve_asgi: Callable[..., Any], tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Servers ``tools`` and ``notes`` (aggregate on); keys and JWTs accepted everywhere but
    on ``/mcp/tools``, which takes API keys only. The JWT maps to team ``agents``, which the
    access rules let use every tool but ``delete_*``."""
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    tools, notes = Counting(sdk_server()), Counting(notes_server())
    servers = {"tools": serve_asgi(tools).url + "/mcp", "notes": serve_asgi(notes).url + "/mcp"}
    signer = SigningKey("rsa-1")
    jwks = tmp_path / "jwks.json"
    section = identity_section(jwks, write_jwks(jwks, signer))
    section["rules"][0].update(team="agents", models=["m"])
    section["accept"] = ["key", "jwt"]
    section["routes"] = {"/mcp/tools": ["key"]}

    def mcp_extra(mcp: dict[str, Any]) -> None:
        mcp["aggregate"] = True

    def cfg_extra(cfg: dict[str, Any]) -> None:
        cfg["identity"] = section

    gw = start_gateway(tmp_path, sim.url, servers, {}, mcp_extra, cfg_extra=cfg_extra)
    try:
        # Issued for the MCP endpoints (RFC 8707: the aggregate's and each server's resource
        # URI), so what refuses it below is the route, not its audience.
        aud = [gw.url + "/mcp", gw.url + "/mcp/tools", gw.url + "/mcp/notes"]
        yield {"gateway": gw, "tools": tools, "notes": notes, "token": signer.token(aud=aud)}
    finally:
        gw.stop()


def _jwt(token: str, **kw: Any) -> dict[str, str]:
    return {**headers(**kw), "authorization": f"Bearer {token}"}


def _refusals(gw: Gateway) -> list[tuple[str | None, str]]:
    return [(r["data"].get("server"), r["data"]["reason"]) for r in gw.records()
            if r["type"] == "mcp.refused"]


def test_every_spelling_of_a_keys_only_mcp_path_refuses_a_jwt(routed: dict[str, Any]) -> None:
    """``/mcp/tools/``, ``/mcp/tools//``, ``/mcp//tools`` reach the server ``tools`` (one
    canonical path for the dispatch and the route check): the JWT is refused there as on
    ``/mcp/tools``; an escaped spelling (``%2f``, ``%2F``, ``%74ools``) is no MCP path at
    all (404, as the relay answers escaped ``/v1/`` paths). Nothing reaches the server."""
    gw, tools, token = routed["gateway"], routed["tools"], routed["token"]
    body = call("echo", {"text": "x"})
    spellings = ["/mcp/tools", "/mcp/tools/", "/mcp/tools//", "/mcp//tools",
                 "/mcp/tools%2f", "/mcp/tools%2F", "/mcp/%74ools", "/mcp%2ftools"]
    got = {p: post(gw.url + p, body, _jwt(token, name="echo")).status_code for p in spellings}
    assert got == {
        "/mcp/tools": 403, "/mcp/tools/": 403, "/mcp/tools//": 403, "/mcp//tools": 403,
        "/mcp/tools%2f": 404, "/mcp/tools%2F": 404, "/mcp/%74ools": 404, "/mcp%2ftools": 404,
    }, got
    # No caller was admitted: the refusals are counted per client and reason (one record at
    # once, the rest of the interval in one more at its end), as the HTTP server's are.
    assert [r for _, r in _refusals(gw)] == ["credential_not_accepted", "unknown_server"]
    assert [s for s in tools.seen if s.startswith("tools/call")] == []
    # The same spelling with an API key is served: the canonical form is the server's name.
    resp = post(gw.url + "/mcp/tools/", body, headers(name="echo"))
    assert resp.status_code == 200, resp.text[:300]
    assert "tools/call:echo" in tools.seen


def test_the_aggregate_applies_the_route_of_each_target_server(routed: dict[str, Any]) -> None:
    """At ``/mcp`` (JWTs accepted) a JWT may call ``notes__add_note`` but not
    ``tools__echo``: ``/mcp/tools`` takes keys only. ``tools/list`` leaves ``tools__*`` out
    for that caller; an API key gets both servers."""
    gw, tools, notes, token = (routed["gateway"], routed["tools"], routed["notes"],
                               routed["token"])
    agg = gw.url + "/mcp"
    resp = post(agg, call("tools__echo", {"text": "x"}), _jwt(token, name="tools__echo"))
    assert resp.status_code == 403, resp.text[:300]
    assert [s for s in tools.seen if s.startswith("tools/call")] == []
    assert _refusals(gw) == [("tools", "credential_not_accepted")]

    resp = post(agg, call("notes__add_note", {"text": "x"}), _jwt(token, name="notes__add_note"))
    assert resp.status_code == 200, resp.text[:300]
    assert "tools/call:add_note" in notes.seen

    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": META}}

    def names(hdrs: dict[str, str]) -> set[str]:
        resp = post(agg, listing, hdrs)
        assert resp.status_code == 200, resp.text[:300]
        return {t["name"] for t in json.loads(resp.text)["result"]["tools"]}

    by_jwt = names(_jwt(token, method="tools/list"))
    by_key = names(headers(method="tools/list"))
    assert by_jwt and all(n.startswith("notes__") for n in by_jwt), by_jwt
    assert "tools__echo" in by_key and by_jwt < by_key

    resp = post(agg, call("tools__echo", {"text": "x"}), headers(name="tools__echo"))
    assert resp.status_code == 200, resp.text[:300]
