"""Building the MCP endpoint from the settings (called by :func:`gateway.assembly.assemble`).

With an egress policy, every declared server must name a destination and its URL must lie
inside it (the check replicas get, :func:`gateway.egress.binding_problems`); the servers'
destinations are then rendered into the NetworkPolicy with the others, and the upstream
session's checked connector and the process guard refuse any address outside them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway.egress import binding_problems
from gateway.errors import ConfigError
from gateway.mcp.aggregate import handle_aggregate
from gateway.mcp.endpoint import McpEndpoint
from gateway.mcp.sessions import load_session_key
from gateway.mcp.settings import McpSettings
from gateway.mcp.spans import ToolCallSpans
from gateway.quotas.tool_calls import ToolCallQuotas
from policy import EgressMatcher, Policy

__all__ = ["build_mcp", "check_mcp_destinations"]

_log = logging.getLogger(__name__)


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
    count_refusal: Callable[[Mapping[str, Any], str | None], None] | None = None,
    record_fetch: Callable[[dict[str, Any]], None] | None = None,
) -> McpEndpoint | None:
    """The MCP endpoint of ``settings`` (``None`` without an ``mcp:`` section); ``spans``
    from the telemetry (:class:`gateway.telemetry.mcp_spans.McpSpans`) and ``quotas`` from the
    quota hook (MCP requests count as requests) when configured; ``count_refusal`` counts the
    refusals of callers not authenticated (:meth:`gateway.audit.observer.AuditObserver.
    mcp_refused`); ``record_fetch`` records the gateway's own catalogue fetches
    (:meth:`gateway.audit.observer.AuditObserver.mcp_catalogue`).

    Raises:
        ConfigError: See :func:`check_mcp_destinations`; ``mcp.session_key_file`` unreadable,
            not base64 or shorter than 32 bytes.
    """
    if settings is None:
        return None
    check_mcp_destinations(settings, policy)
    if policy is not None and matcher is None:
        matcher = EgressMatcher(policy)
    key = None
    if settings.session_key_file is not None:
        try:
            key = load_session_key(settings.session_key_file)
        except ValueError as exc:
            raise ConfigError(f"mcp.session_key_file: {exc}") from exc
    else:
        _log.info("mcp.session_key_file not set: sessions of 2025 MCP clients continue only "
                  "in the process that opened them")
    return McpEndpoint(settings, policy, matcher, audit, key, aggregate=handle_aggregate,
                       spans=spans, quotas=quotas, count_refusal=count_refusal,
                       record_fetch=record_fetch)
