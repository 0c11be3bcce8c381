"""Per-caller, per-tool authorisation of MCP calls (allow/deny globs of ``mcp.access``).

Built on the authenticated principal (key id, team), so a principal issued from an identity
token is judged the same way as one from an API key. Deny wins over allow; a caller no rule
matches may call nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from gateway.mcp.settings import McpAccessRule

__all__ = ["ToolAccess", "ToolVerdict"]


@dataclass(frozen=True, slots=True)
class ToolVerdict:
    """Outcome of one access check.

    Attributes:
        allowed: Whether the caller may call the tool.
        reason: Why (the matching rule or pattern), safe to audit.
    """

    allowed: bool
    reason: str


def _any(patterns: Sequence[str], value: str | None) -> str | None:
    if value is None:
        return None
    for pattern in patterns:
        if fnmatchcase(value, pattern):
            return pattern
    return None


class ToolAccess:
    """The ``mcp.access`` rules, evaluated per (caller, server, tool).

    Args:
        rules: The rules in configuration order.
    """

    def __init__(self, rules: Sequence[McpAccessRule]) -> None:
        self._rules = tuple(rules)

    def _matching(self, key_id: str, team: str | None,
                  server: str) -> list[tuple[int, McpAccessRule]]:
        return [
            (i, r) for i, r in enumerate(self._rules)
            if (_any(r.keys, key_id) or _any(r.teams, team)) and _any(r.servers, server)
        ]

    def may_use_server(self, key_id: str, team: str | None, server: str) -> bool:
        """True when some rule for ``server`` matches the caller (it may call some tool)."""
        return any(r.allow for _, r in self._matching(key_id, team, server))

    def check(self, key_id: str, team: str | None, server: str, tool: str) -> ToolVerdict:
        """May the caller call ``tool`` on ``server``?

        Args:
            key_id: The principal's key id.
            team: The principal's team.
            server: The configured server name.
            tool: The tool name as the client sent it.

        Returns:
            The verdict with the deciding rule (``access[i]``) in its reason.
        """
        allowed_by: str | None = None
        for i, rule in self._matching(key_id, team, server):
            denied = _any(rule.deny, tool)
            if denied is not None:
                return ToolVerdict(False, f"access[{i}] denies {denied!r}")
            allowed = _any(rule.allow, tool)
            if allowed is not None and allowed_by is None:
                allowed_by = f"access[{i}] allows {allowed!r}"
        if allowed_by is None:
            return ToolVerdict(False, f"no access rule lets key {key_id} call {tool!r} on {server}")
        return ToolVerdict(True, allowed_by)
