"""The tracing seam of the MCP endpoint (:class:`ToolCallSpans`).

The endpoint calls :meth:`ToolCallSpans.forwarding` just before a request is forwarded (the
span's own ``traceparent`` then goes upstream in place of the client's, so the MCP server's
spans hang under the gateway's) and :meth:`ToolCallSpans.finished` once the request is over,
forwarded or refused. The implementation, with OpenTelemetry, is
:class:`gateway.telemetry.mcp_spans.McpSpans`; without telemetry the endpoint has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.mcp.records import CallRecord

__all__ = ["ToolCallSpans"]


class ToolCallSpans(Protocol):
    """Opens and closes the span of one MCP request."""

    def forwarding(self, rec: CallRecord,
                   headers: Mapping[str, str]) -> tuple[object, dict[str, str]]:
        """The request passed every check and is about to be forwarded.

        Args:
            rec: The request's record so far (server, tool, caller, class).
            headers: The client's request headers (lower-case names): its ``traceparent``
                and ``tracestate`` are the parent.

        Returns:
            A token for :meth:`finished`, and the trace headers to send upstream instead of
            the client's.
        """
        ...

    def finished(self, rec: CallRecord, headers: Mapping[str, str],
                 token: object | None) -> None:
        """The request is over (``token`` from :meth:`forwarding`, ``None`` when it was
        refused before forwarding: the span is then opened and closed here)."""
        ...
