"""The MCP gateway: agent tool calls through the same door as model calls.

Each server of the ``mcp:`` section is served at ``/mcp/<name>`` (Streamable HTTP), is an
egress destination of the policy, and every tool call or refusal is one audit record.
Modules: :mod:`~gateway.mcp.settings` (config), :mod:`~gateway.mcp.jsonrpc` (framing and
header checks), :mod:`~gateway.mcp.access` (per-tool globs), :mod:`~gateway.mcp.arguments`
(size, schema, URL checks), :mod:`~gateway.mcp.catalogue` (upstream tool lists),
:mod:`~gateway.mcp.upstream` (forwarding, bounded answers), :mod:`~gateway.mcp.sse`,
:mod:`~gateway.mcp.sessions` (caller-bound session ids), :mod:`~gateway.mcp.records` (audit),
:mod:`~gateway.mcp.metadata` (RFC 9728), :mod:`~gateway.mcp.params` (``Mcp-Param-*``),
:mod:`~gateway.mcp.endpoint` (the ASGI handler), :mod:`~gateway.mcp.aggregate` (``/mcp``).
"""

from gateway.mcp.paths import AGGREGATE, PREFIX, WELL_KNOWN
from gateway.mcp.settings import McpSettings

__all__ = ["AGGREGATE", "PREFIX", "WELL_KNOWN", "McpSettings"]

# The endpoint (gateway.mcp.endpoint.McpEndpoint) is not re-exported here: gateway.config.settings
# imports this package for McpSettings, and the endpoint imports the gateway core.
