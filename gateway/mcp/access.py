"""Per-caller, per-tool authorisation of MCP calls (allow/deny globs of ``mcp.access``).

Built on the authenticated principal (key id, team), so a principal issued from an identity
token is judged the same way as one from an API key. The rule semantics are
:func:`policy.check_tool_access` (shared with ``policy explain``): deny wins, no match refuses.

The rules are fixed for the life of a :class:`ToolAccess` (``mcp:`` is restart-only), so a
verdict depends only on (key id, team, server, tool) and is kept once computed: the glob
matching runs once per caller and tool, not per call. The memo is bounded
(:data:`MEMO_ENTRIES`; emptied when full), so callers naming ever new tools cannot grow it.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.mcp.settings import McpAccessRule
from policy import ToolVerdict, check_tool_access

__all__ = ["MEMO_ENTRIES", "ToolAccess", "ToolVerdict"]

MEMO_ENTRIES = 4096
"""Most verdicts kept (key id, team, server, tool); the memo is emptied when it is full."""


class ToolAccess:
    """The ``mcp.access`` rules, evaluated per (caller, server, tool).

    Args:
        rules: The rules in configuration order.
    """

    def __init__(self, rules: Sequence[McpAccessRule]) -> None:
        self._rules = [r.model_dump() for r in rules]
        self._memo: dict[tuple[str, str | None, str, str | None], ToolVerdict] = {}

    def may_use_server(self, key_id: str, team: str | None, server: str) -> bool:
        """True when some rule for ``server`` lets the caller call some tool."""
        return self._verdict(key_id, team, server, None).allowed

    def check(self, key_id: str, team: str | None, server: str, tool: str) -> ToolVerdict:
        """May the caller call ``tool`` on ``server``? The verdict names the deciding rule."""
        return self._verdict(key_id, team, server, tool)

    def _verdict(self, key_id: str, team: str | None, server: str,
                 tool: str | None) -> ToolVerdict:
        key = (key_id, team, server, tool)
        verdict = self._memo.get(key)
        if verdict is None:
            verdict = check_tool_access(self._rules, key_id, team, server, tool)
            if len(self._memo) >= MEMO_ENTRIES:
                self._memo.clear()
            self._memo[key] = verdict
        return verdict
