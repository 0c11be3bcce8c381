"""Sensitive data in MCP tool arguments (issue 34), end to end: the official ``mcp`` SDK client
through a real ``gateway serve`` whose policy has a ``pii`` section, to the SDK upstream server.

The harness's tool servers may receive ``public`` and ``internal`` data, never ``secret``; the
``pii`` section raises a finding to ``secret``, refuses cards, and masks for ``k-other``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from gateway.mcp.records import name_digest
from tests.gateway.mcp_gateway.harness import KEYS, Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_sdk_through_gateway import sdk_client
from tests.gateway.mcp_gateway.upstreams import Counting, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

PII = """pii:
  default_class: secret
  default_action: raise
  rules:
    - {id: no-cards, entities: [CREDIT_CARD], action: refuse}
    - {id: other-masks, keys: [k-other], action: mask}
"""
IBAN = "DE89 3704 0044 0532 0130 00"
# Pieces of the IBAN long enough that a random id or digest in a record cannot hold them by
# chance (a bare "3704" did: a hex request id that held it failed the test once).
IBAN_PIECES = ("DE89", "3704 0044", "37040044", "0532 0130", "05320130")


def _leaks_iban(text: str) -> bool:
    return any(piece in text for piece in IBAN_PIECES)
CARD = "4111 1111 1111 1111"


@pytest.fixture(scope="module")
def shared_pii_stack(serve_asgi_module: Callable[..., Any],
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The SDK upstream (counting what it receives), the simulator, the gateway with ``pii``;
    one for the module's tests (use it through :func:`pii_stack`): no test changes it, each
    opens its own MCP session, and the gateway has no quota or budget."""
    sim = serve_asgi_module(create_sim(SimConfig(models=["m"])))
    counting = Counting(sdk_server())
    tools = serve_asgi_module(counting)
    gw: Gateway = start_gateway(tmp_path_factory.mktemp("mcp-pii"), sim.url,
                                {"tools": tools.url + "/mcp"}, {}, policy_extra=PII)
    try:
        yield {"gateway": gw, "upstream": counting}
    finally:
        gw.stop()


@pytest.fixture
def pii_stack(shared_pii_stack: dict[str, Any]) -> dict[str, Any]:
    """:func:`shared_pii_stack` as one test sees it: the records and upstream calls it caused."""
    shared_pii_stack["upstream"].seen.clear()
    return {**shared_pii_stack, "gateway": shared_pii_stack["gateway"].from_now()}


def _call(gw: Gateway, key: str, text: str, extra: dict[str, Any] | None = None) -> Any:
    """``echo(text, **extra)`` through the gateway: the echoed text, or the ``MCPError``."""

    async def go() -> Any:
        async with sdk_client(gw.mcp("tools"), key) as client:
            try:
                result = await client.call_tool("echo", {"text": text, **(extra or {})})
            except MCPError as exc:
                return exc
            return result.content[0].text  # type: ignore[union-attr]

    return anyio.run(go)


def _calls(gw: Gateway) -> list[dict[str, Any]]:
    # A call refused before the tool catalogue was read names the tool by its digest only.
    return [r["data"] for r in gw.records() if r["type"] in ("mcp.tool_call", "mcp.refused")
            and (r["data"].get("tool") == "echo"
                 or r["data"].get("unknown_names") == {"tool": name_digest("echo")})]


def test_iban_raises_the_class_and_the_call_is_refused_before_forwarding(
        pii_stack: dict[str, Any]) -> None:
    gw, upstream = pii_stack["gateway"], pii_stack["upstream"]
    assert _call(gw, KEYS["agent"], "nothing sensitive here") == "nothing sensitive here"
    assert upstream.calls() == ["tools/call:echo"]

    err = _call(gw, KEYS["agent"], f"please pay to {IBAN} today")
    assert isinstance(err, MCPError), err
    assert "may not receive data class secret" in str(err)
    assert not _leaks_iban(str(err))
    assert upstream.calls() == ["tools/call:echo"]  # the second call never arrived

    err = _call(gw, KEYS["agent"], f"card {CARD} please")
    assert isinstance(err, MCPError), err
    assert "CREDIT_CARD" in str(err) and "1111" not in str(err)
    assert upstream.calls() == ["tools/call:echo"]

    clean, raised, card = _calls(gw)
    assert clean["decision"] == "allow" and clean["pii"]["entities"] == {}
    assert clean["pii"]["class_after"] == "internal" and clean["data_class"] == "internal"
    assert raised["decision"] == "deny" and raised["reason"] == "class_refused"
    assert raised["status"] == 403 and raised["data_class"] == "secret"
    assert raised["pii"]["entities"] == {"IBAN_CODE": 1}
    assert raised["pii"]["actions"] == {"IBAN_CODE": "raise"}
    assert (raised["pii"]["class_before"], raised["pii"]["class_after"]) == ("internal",
                                                                              "secret")
    assert card["reason"] == "pii_refused" and card["status"] == 403
    assert card["pii"]["entities"] == {"CREDIT_CARD": 1}
    assert card["pii"]["actions"] == {"CREDIT_CARD": "refuse"}
    for rec in (clean, raised, card):
        dumped = json.dumps(rec)
        assert not _leaks_iban(dumped) and "1111 1111" not in dumped


def test_mask_rule_forwards_masked_arguments(pii_stack: dict[str, Any]) -> None:
    gw, upstream = pii_stack["gateway"], pii_stack["upstream"]
    echoed = _call(gw, KEYS["other"], f"please pay to {IBAN} today")
    assert echoed == "please pay to <IBAN_CODE> today"  # what the upstream's echo received
    assert upstream.calls() == ["tools/call:echo"]
    (rec,) = _calls(gw)
    assert rec["decision"] == "allow" and rec["data_class"] == "internal"
    assert rec["pii"]["entities"] == {"IBAN_CODE": 1}
    assert rec["pii"]["actions"] == {"IBAN_CODE": "mask"}
    assert rec["pii"]["rules"] == {"IBAN_CODE": "other-masks"}
    assert not _leaks_iban(json.dumps(rec))


def test_a_mask_rule_refuses_a_call_whose_argument_name_holds_data(
        pii_stack: dict[str, Any]) -> None:
    """A name cannot be masked (the arguments' shape would change): the call fails closed,
    nothing is forwarded, and the record holds neither the name nor its digits."""
    gw, upstream = pii_stack["gateway"], pii_stack["upstream"]
    err = _call(gw, KEYS["other"], "hello", {IBAN.replace(" ", ""): "x"})
    assert isinstance(err, MCPError), err
    assert "argument name" in str(err) and "IBAN_CODE" in str(err) and not _leaks_iban(str(err))
    assert upstream.calls() == []
    (rec,) = _calls(gw)
    assert rec["reason"] == "pii_refused" and rec["status"] == 403
    assert rec["pii"]["actions"] == {"IBAN_CODE": "refuse"}
    assert rec["pii"]["in_keys"] == {"IBAN_CODE": 1}
    assert not _leaks_iban(json.dumps(gw.records()))


def test_identifiers_written_with_unicode_spaces_or_as_a_float_are_caught(
        pii_stack: dict[str, Any]) -> None:
    """tester2 F1/F2: a card grouped by narrow no-break spaces, a card sent as a JSON float and
    an IBAN grouped by no-break spaces reached the tool; now refused, refused and masked."""
    gw, upstream = pii_stack["gateway"], pii_stack["upstream"]
    err = _call(gw, KEYS["agent"], "card " + CARD.replace(" ", "\u202f"))
    assert isinstance(err, MCPError), err
    assert "CREDIT_CARD" in str(err)
    err = _call(gw, KEYS["agent"], "hello", {"ref": 4111111111111111.0})
    assert isinstance(err, MCPError), err
    assert "CREDIT_CARD" in str(err)
    assert upstream.calls() == []
    echoed = _call(gw, KEYS["other"], "pay to " + IBAN.replace(" ", "\u00a0") + " today")
    assert echoed == "pay to <IBAN_CODE> today"
    assert upstream.calls() == ["tools/call:echo"]
