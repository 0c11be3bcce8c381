"""Spans of MCP requests (``/mcp/<server>``): one server span per request, refusals included.

Names and attributes follow the OpenTelemetry semantic conventions for MCP (Development
status; semantic-conventions-genai, ``docs/gen-ai/mcp.md``): name ``"{mcp.method.name}
{target}"`` (``tools/call fetch``), ``mcp.method.name``, ``gen_ai.tool.name`` and
``gen_ai.operation.name`` ``execute_tool`` for tool calls, ``mcp.protocol.version``,
``jsonrpc.protocol.version``, ``rpc.jsonrpc.error_code`` and ``error.type`` on failures; plus
``sg.mcp.server``, ``sg.destination.id``, ``sg.key.id``, ``sg.team``, ``sg.data_class``,
``sg.decision``, ``sg.mcp.reason``, ``sg.request.id``, ``sg.mcp.bytes_in`` and
``sg.mcp.bytes_out`` (bytes) and ``http.response.status_code``. The span lasts from the
request's arrival to its end (its duration is the call's). Never argument or result content.

Context: the client's W3C ``traceparent``/``tracestate`` is the parent, so a tool call sits in
the trace of the chat completion whose answer asked for it; the span's own ``traceparent`` is
what goes upstream to the MCP server.

The same hook records each forwarded tool call's duration in the
``sg.gateway.mcp.tool_call.duration`` histogram (seconds, by server and tool) once the
telemetry's metrics exist (:meth:`gateway.telemetry.Telemetry.bind` sets :attr:`McpSpans.metrics`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from gateway.mcp.records import CallRecord
    from gateway.telemetry.metrics import GatewayMetrics

__all__ = ["McpSpans"]

_TRACE_HEADERS = ("traceparent", "tracestate")


class McpSpans:
    """The :class:`gateway.mcp.spans.ToolCallSpans` of the gateway's telemetry.

    Args:
        tracer: A tracer of the telemetry's own ``TracerProvider``.

    Attributes:
        metrics: Receives the tool-call durations (``None`` until the telemetry is bound).
    """

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer
        self._propagator = TraceContextTextMapPropagator()
        self.metrics: GatewayMetrics | None = None

    def forwarding(self, rec: CallRecord,
                   headers: Mapping[str, str]) -> tuple[object, dict[str, str]]:
        """Open the request's span (backdated to its arrival); the trace headers to send
        upstream. A client without a ``traceparent`` gets the span's trace id on its audit
        record."""
        span = self._start(rec, headers)
        ctx = span.get_span_context()
        if rec.trace_id is None and ctx.is_valid:
            rec.trace_id = format(ctx.trace_id, "032x")
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=set_span_in_context(span))
        return span, carrier

    def finished(self, rec: CallRecord, headers: Mapping[str, str],
                 token: object | None) -> None:
        """Close the span with the request's outcome (a refusal gets its span here)."""
        span = token if isinstance(token, Span) else self._start(rec, headers)
        final: dict[str, Any] = {
            "sg.decision": rec.decision,
            "sg.mcp.bytes_in": rec.bytes_in,
            "sg.mcp.bytes_out": rec.bytes_out,
            "http.response.status_code": rec.status,
        }
        for name, value in (("sg.data_class", rec.data_class),  # a pii scan may raise it
                            ("sg.mcp.reason", rec.reason),
                            ("rpc.jsonrpc.error_code", rec.rpc_error)):
            if value is not None:
                final[name] = value
        span.set_attributes(final)
        if rec.reason is not None or rec.decision != "allow":
            span.set_attribute("error.type", rec.reason or "refused")
            span.set_status(Status(StatusCode.ERROR))
        span.end()
        if self.metrics is not None and rec.method == "tools/call" and rec.decision == "allow":
            self.metrics.mcp_duration.record(rec.duration_us / 1e6,
                                             (rec.server or "-", rec.tool or "-"))

    def _start(self, rec: CallRecord, headers: Mapping[str, str]) -> Span:
        carrier = {k: headers[k] for k in _TRACE_HEADERS if k in headers}
        parent = self._propagator.extract(carrier) if carrier else None
        method = rec.method or "mcp"
        target = rec.tool if method == "tools/call" else None
        attrs: dict[str, Any] = {"mcp.method.name": method, "jsonrpc.protocol.version": "2.0",
                                 "sg.request.id": rec.request_id}
        if target is not None:
            attrs["gen_ai.tool.name"] = target
            attrs["gen_ai.operation.name"] = "execute_tool"
        for name, value in (("sg.mcp.server", rec.server),
                            ("sg.destination.id", rec.destination),
                            ("sg.key.id", rec.key_id), ("sg.team", rec.team),
                            ("sg.data_class", rec.data_class),
                            ("mcp.protocol.version", rec.protocol_version)):
            if value is not None:
                attrs[name] = value
        return self._tracer.start_span(
            f"{method} {target}" if target else method,
            context=parent,
            kind=SpanKind.SERVER,
            start_time=rec.started_us * 1000,
            attributes=attrs,
        )
