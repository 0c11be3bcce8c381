"""The scheme of a URL argument, checked by :func:`gateway.mcp.arguments.check_url_arguments`
with the tool's ``url_schemes`` (default ``http``/``https``) before the egress policy.

The end-to-end refusal through ``gateway serve`` is in ``test_mcp_bad_input.py``; here the
widening a tool's settings ask for (through the check, and end to end), and the setting's
validation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic
import pytest

from gateway.mcp.arguments import check_url_arguments
from gateway.mcp.jsonrpc import McpRefusal
from gateway.mcp.settings import McpToolSettings
from policy import EgressMatcher, Policy
from policy import Principal as PolicyPrincipal
from tests.gateway.mcp_gateway.harness import start_gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import call, headers, post
from tests.gateway.mcp_gateway.upstreams import Counting, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

POLICY = Policy.from_text(
    "version: 1\ndata_classes: [public]\ndestinations:\n"
    "  - {id: files, url: 'http://127.0.0.1:2121', region: lo, jurisdiction: EU,"
    " operator: me}\n"
    "rules:\n  - {id: public-anywhere, classes: [public]}\n")


def _check(url: str, tool: McpToolSettings) -> None:
    asyncio.run(check_url_arguments({"src": url}, ["src"], EgressMatcher(POLICY), POLICY,
                                    PolicyPrincipal("k", None), "public",
                                    schemes=tool.url_schemes))


def test_a_tool_may_widen_its_schemes_and_the_host_is_still_checked() -> None:
    default = McpToolSettings()
    ftp = McpToolSettings.model_validate({"url_schemes": ["FTP", "https"]})
    assert default.url_schemes == {"http", "https"} and ftp.url_schemes == {"ftp", "https"}
    _check("http://127.0.0.1:2121/a", default)
    with pytest.raises(McpRefusal) as refused:
        _check("ftp://127.0.0.1:2121/a", default)
    assert (refused.value.status, refused.value.reason) == (400, "url_invalid")
    assert "scheme 'ftp' is not allowed" in str(refused.value.message)
    _check("ftp://127.0.0.1:2121/a", ftp)  # widened: the same host passes
    with pytest.raises(McpRefusal) as refused:  # ... and another host still does not
        _check("ftp://127.0.0.1:21/a", ftp)
    assert (refused.value.status, refused.value.reason) == (403, "url_denied")
    with pytest.raises(McpRefusal) as refused:
        _check("http://127.0.0.1:2121/a", ftp)  # http is no longer in this tool's list
    assert refused.value.reason == "url_invalid"


@pytest.mark.parametrize("schemes", [[], ["ht tp"], ["1http"], ["http://"]])
def test_url_schemes_must_be_schemes(schemes: list[str]) -> None:
    with pytest.raises(pydantic.ValidationError):
        McpToolSettings.model_validate({"url_schemes": schemes})


def test_a_widened_tool_forwards_its_extra_scheme_through_the_gateway(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    """``url_schemes: [http, https, ftp]`` on ``fetch_url``: through a real ``gateway serve``
    an ``ftp://`` URL to a host the policy allows is forwarded; ``gopher://`` is still refused
    before anything leaves."""
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    counting = Counting(sdk_server())
    tools = serve_asgi(counting)
    web = serve_asgi(create_sim(SimConfig(models=["w"])))

    def extra(mcp: dict[str, Any]) -> None:
        for server in mcp["servers"]:
            if server["name"] == "tools":
                server["tools"] = {"fetch_url": {"url_arguments": ["url"],
                                                 "url_schemes": ["http", "https", "ftp"]}}

    gw = start_gateway(tmp_path, sim.url, {"tools": tools.url + "/mcp"}, {"web": web.port},
                       extra)
    try:
        url = gw.mcp("tools")
        refused = post(url, call("fetch_url", {"url": f"gopher://127.0.0.1:{web.port}/x"}),
                       headers(name="fetch_url"))
        assert refused.status_code == 400, refused.text
        assert "scheme 'gopher' is not allowed" in refused.json()["error"]["message"]
        assert counting.calls() == []
        passed = post(url, call("fetch_url", {"url": f"ftp://127.0.0.1:{web.port}/x"}),
                      headers(name="fetch_url"))
        assert passed.status_code == 200, passed.text
        assert counting.calls() == ["tools/call:fetch_url"]
    finally:
        gw.stop()
