"""Spans and metrics of MCP tool calls, from a real ``gateway serve`` to a real OTLP receiver
(``oteltest``'s sink) and a real scrape of the admin ``/metrics`` page.

A tool call and a refused one, both sent with the agent's ``traceparent``: each gets a server
span in the agent's trace (parent: the agent's span id) named after the MCP semantic
conventions, with server, tool, decision, data class, bytes and reason, and without argument
content; the upstream MCP server receives the gateway span's ``traceparent``, not the
client's. The counters by decision and reason and the tool-call duration histogram are on
``/metrics``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.gateway.mcp_gateway.harness import KEYS, start_gateway
from tests.gateway.mcp_gateway.upstreams import sdk_server
from tests.gateway.telemetry.otlp_sink import OtlpSink, attributes
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}}


class TraceHeaders:
    """ASGI wrapper keeping ``(Mcp-Method, traceparent)`` of each request the server got."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str | None, str | None]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            self.seen.append(tuple(  # type: ignore[arg-type]
                v.decode() if v is not None else None
                for v in (headers.get(b"mcp-method"), headers.get(b"traceparent"))))
        await self.app(scope, receive, send)


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    sink = OtlpSink().start()
    yield sink
    sink.stop()


def _call(url: str, tool: str, arguments: dict[str, Any], traceparent: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": META}}
    return httpx.post(url, content=json.dumps(body), timeout=30, headers={
        "authorization": f"Bearer {KEYS['agent']}", "content-type": "application/json",
        "accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call", "mcp-name": tool, "traceparent": traceparent})


def test_tool_calls_and_refusals_are_spans_in_the_agents_trace(
        serve_asgi: Callable[..., Any], tmp_path: Path, sink: OtlpSink) -> None:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    upstream = TraceHeaders(sdk_server())
    tools = serve_asgi(upstream)

    def telemetry(cfg: dict[str, Any]) -> None:
        cfg["telemetry"].update(otlp_endpoint=sink.url, otlp_endpoint_destination="collector",
                                export_interval_s=0.2)

    gw = start_gateway(tmp_path, sim.url, {"tools": tools.url + "/mcp"},
                       {"collector": sink.port}, cfg_extra=telemetry)
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = f"00-{trace_id}-{parent}-01"
    try:
        ok = _call(gw.mcp("tools"), "echo", {"text": "words never in a span"}, traceparent)
        assert ok.status_code == 200 and "words never in a span" in ok.text
        denied = _call(gw.mcp("tools"), "delete_everything", {}, traceparent)
        assert denied.status_code == 403
        samples = gw.metrics("sg_gateway_mcp")
    finally:
        gw.stop()  # SIGTERM: the telemetry flushes its spans on the way out
    sink.wait(lambda s: {"tools/call echo", "tools/call delete_everything"}
              <= {sp.name for sp in s.spans()})
    spans = {s.name: s for s in sink.spans()}
    echo, refused = spans["tools/call echo"], spans["tools/call delete_everything"]

    for span in (echo, refused):
        assert span.kind == Span.SPAN_KIND_SERVER
        assert span.trace_id.hex() == trace_id and span.parent_span_id.hex() == parent
    a = attributes(echo.attributes)
    assert {k: a[k] for k in ("mcp.method.name", "gen_ai.tool.name", "gen_ai.operation.name",
                              "sg.mcp.server", "sg.destination.id", "sg.key.id",
                              "sg.data_class", "sg.decision", "http.response.status_code",
                              "mcp.protocol.version")} == {
        "mcp.method.name": "tools/call", "gen_ai.tool.name": "echo",
        "gen_ai.operation.name": "execute_tool", "sg.mcp.server": "tools",
        "sg.destination.id": "tools-tools", "sg.key.id": "k-agent", "sg.data_class": "internal",
        "sg.decision": "allow", "http.response.status_code": 200,
        "mcp.protocol.version": "2026-07-28"}
    assert a["sg.mcp.bytes_in"] > 0 and a["sg.mcp.bytes_out"] > 0
    assert "sg.mcp.reason" not in a and echo.status.code != Status.STATUS_CODE_ERROR
    assert echo.end_time_unix_nano > echo.start_time_unix_nano
    assert not any("never in a span" in str(v) for v in a.values())
    r = attributes(refused.attributes)
    assert (r["sg.decision"], r["sg.mcp.reason"], r["error.type"],
            r["http.response.status_code"]) == ("deny", "tool_denied", "tool_denied", 403)
    assert refused.status.code == Status.STATUS_CODE_ERROR

    # The server got the gateway span's traceparent for the call (the refusal never left).
    calls = [tp for method, tp in upstream.seen if method == "tools/call"]
    assert calls == [f"00-{trace_id}-{echo.span_id.hex()}-01"]

    # A real scrape of /metrics: counts by decision and reason, the duration histogram.
    def value(name: str, **labels: str) -> float:
        return sum(v for key, v in samples.items() if dict(key)["__name__"] == name
                   and all(dict(key).get(k) == w for k, w in labels.items()))

    assert value("sg_gateway_mcp_calls_total", sg_mcp_tool="echo", sg_decision="allow") == 1
    assert value("sg_gateway_mcp_calls_total", sg_mcp_tool="delete_everything",
                 sg_decision="deny", sg_mcp_reason="tool_denied") == 1
    assert value("sg_gateway_mcp_tool_call_duration_seconds_count", sg_mcp_server="tools",
                 sg_mcp_tool="echo") == 1
    assert value("sg_gateway_mcp_tool_call_duration_seconds_sum", sg_mcp_tool="echo") > 0
    assert value("sg_gateway_mcp_tool_call_duration_seconds_count",
                 sg_mcp_tool="delete_everything") == 0  # refusals are counted, not timed
    assert value("sg_gateway_mcp_tool_call_time_seconds_total", sg_mcp_server="tools") > 0

    # The audit records of the call (before it left, after its answer) carry the agent's
    # trace id, and so does the refusal's.
    records = [(r["type"], r["data"]) for r in gw.records()
               if r["type"].startswith("mcp.") and r["type"] != "mcp.catalogue"]
    assert [(kind, r["tool"], r["trace_id"]) for kind, r in records] == [
        ("mcp.started", "echo", trace_id), ("mcp.tool_call", "echo", trace_id),
        ("mcp.refused", "delete_everything", trace_id)]
