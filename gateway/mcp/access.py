"""Per-caller, per-tool authorisation of MCP calls (allow/deny globs of ``mcp.access``).

Built on the authenticated principal (key id, team), so a principal issued from an identity
token is judged the same way as one from an API key. The rule semantics are
:func:`policy.check_tool_access` (shared with ``policy explain``): deny wins, no match refuses.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.mcp.settings import McpAccessRule
from policy import ToolVerdict, check_tool_access

__all__ = ["ToolAccess", "ToolVerdict"]


class ToolAccess:
    """The ``mcp.access`` rules, evaluated per (caller, server, tool).

    Args:
        rules: The rules in configuration order.
    """

    def __init__(self, rules: Sequence[McpAccessRule]) -> None:
        self._rules = [r.model_dump() for r in rules]

    def may_use_server(self, key_id: str, team: str | None, server: str) -> bool:
        """True when some rule for ``server`` lets the caller call some tool."""
        return check_tool_access(self._rules, key_id, team, server, None).allowed

    def check(self, key_id: str, team: str | None, server: str, tool: str) -> ToolVerdict:
        """May the caller call ``tool`` on ``server``? The verdict names the deciding rule."""
        return check_tool_access(self._rules, key_id, team, server, tool)
