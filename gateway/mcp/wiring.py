"""Building the MCP endpoint from the settings (called by :func:`gateway.assembly.assemble`).

With an egress policy, every declared server must name a destination and its URL must lie
inside it (the check replicas get, :func:`gateway.egress.binding_problems`); the servers'
destinations are then rendered into the NetworkPolicy with the others, and the upstream
session's checked connector and the process guard refuse any address outside them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway.egress import binding_problems
from gateway.errors import ConfigError
from gateway.mcp.endpoint import McpEndpoint
from gateway.mcp.settings import McpSettings
from gateway.mcp.spans import ToolCallSpans
from gateway.quotas.tool_calls import ToolCallQuotas
from policy import EgressMatcher, Policy

__all__ = ["build_mcp", "check_mcp_destinations"]


def check_mcp_destinations(settings: McpSettings, policy: Policy | None) -> None:
    """Check each server's destination binding.

    Raises:
        ConfigError: ``mcp.servers[i].destination``: missing, unknown, or the URL outside it.
    """
    if policy is None:
        return
    problems = binding_problems(policy, (
        (f"mcp.servers[{i}].destination", server.url, server.destination)
        for i, server in enumerate(settings.servers)))
    if problems:
        raise ConfigError("\n".join(problems), code="destination_mismatch")


def build_mcp(
    settings: McpSettings | None,
    policy: Policy | None,
    matcher: EgressMatcher | None,
    audit: Callable[[Mapping[str, Any]], Awaitable[Any]] | None,
    spans: ToolCallSpans | None = None,
    quotas: ToolCallQuotas | None = None,
) -> McpEndpoint | None:
    """The MCP endpoint of ``settings`` (``None`` without an ``mcp:`` section); ``spans``
    from the telemetry (:class:`gateway.telemetry.mcp_spans.McpSpans`) and ``quotas`` from the
    quota hook (tool calls count as requests) when configured.

    Raises:
        ConfigError: See :func:`check_mcp_destinations`.
    """
    if settings is None:
        return None
    check_mcp_destinations(settings, policy)
    if policy is not None and matcher is None:
        matcher = EgressMatcher(policy)
    return McpEndpoint(settings, policy, matcher, audit, spans, quotas)
