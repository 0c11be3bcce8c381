"""A tool call whose ``pii`` scan does not finish is not forwarded below its class (tester F5).

The harness's tool servers may never receive ``secret``; the ``pii`` section raises any finding
to ``secret``, refuses cards and masks for ``k-other`` (test_mcp_pii_arguments.py's section).
A pad that makes the scan outlast ``timeout_s`` used to let an IBAN through to the tool server
(the call passed unscanned at its ``internal`` class). Now the unscanned call is raised to
``secret`` (refused: the server may not receive it), or refused 503 ``pii_scan_failed`` where a
``mask`` or ``refuse`` action could apply. The official ``mcp`` SDK client through a real
``gateway serve``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from tests.conftest import ServerThread
from tests.gateway.mcp_gateway.harness import KEYS, Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_pii_arguments import _call
from tests.gateway.mcp_gateway.upstreams import Counting, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

PII = """pii:
  default_class: secret
  default_action: raise
  timeout_s: %s
  inline_max_chars: %d%s
  rules:
    - {id: other-masks, keys: [k-other], action: mask}
"""
IBAN = "DE89 3704 0044 0532 0130 00"
PAD = " ".join(str(10**9 + i * 7919) for i in range(20000))  # ~220 KB of digit runs


def _start(serve_asgi: Callable[..., ServerThread], tmp_path: Path, timeout_s: str,
           inline: int, limit: str = "") -> Iterator[tuple[Gateway, Counting]]:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    counting = Counting(sdk_server())
    tools = serve_asgi(counting)
    gw = start_gateway(tmp_path, sim.url, {"tools": tools.url + "/mcp"}, {},
                       policy_extra=PII % (timeout_s, inline, limit))
    try:
        yield gw, counting
    finally:
        gw.stop()


@pytest.fixture
def padded(serve_asgi: Callable[..., ServerThread],
           tmp_path: Path) -> Iterator[tuple[Gateway, Counting]]:
    yield from _start(serve_asgi, tmp_path, "0.05", 8192)


@pytest.fixture
def over_limit(serve_asgi: Callable[..., ServerThread],
               tmp_path: Path) -> Iterator[tuple[Gateway, Counting]]:
    """Texts over 20,000 characters are not scanned (the session's own messages are)."""
    yield from _start(serve_asgi, tmp_path, "5.0", 8192, "\n  max_scan_chars: 20000")


def _calls(gw: Gateway) -> list[dict[str, Any]]:
    return [r["data"] for r in gw.records() if r["type"] in ("mcp.tool_call", "mcp.refused")
            and r["data"].get("pii") is not None]


def test_a_padded_iban_never_reaches_the_tool_server(
        padded: tuple[Gateway, Counting]) -> None:
    gw, upstream = padded
    for text in (f"pay to {IBAN}", f"pay to {IBAN} " + PAD):
        err = _call(gw, KEYS["agent"], text)
        assert isinstance(err, MCPError), str(err)[:200]
        assert "may not receive data class secret" in str(err)
    assert upstream.calls() == []
    assert all(r["data_class"] == "secret" for r in _calls(gw))


def test_an_unscanned_call_is_raised_or_refused(
        over_limit: tuple[Gateway, Counting]) -> None:
    gw, upstream = over_limit
    err = _call(gw, KEYS["agent"], "nothing sensitive here " + PAD)
    assert isinstance(err, MCPError) and "may not receive data class secret" in str(err)
    err = _call(gw, KEYS["other"], f"pay to {IBAN} " + PAD)  # a mask rule: not unscanned
    assert isinstance(err, MCPError) and "IBAN_CODE" in str(err) and "3704" not in str(err)
    assert upstream.calls() == []
    raised, refused = [r for r in _calls(gw) if r.get("mcp_method") == "tools/call"]
    assert raised["reason"] == "class_refused" and raised["data_class"] == "secret"
    assert raised["pii"]["error"] == "scan skipped (text over pii.max_scan_chars)"
    assert (raised["pii"]["class_before"], raised["pii"]["class_after"]) == ("internal",
                                                                              "secret")
    assert refused["reason"] == "pii_scan_failed" and refused["status"] == 503
