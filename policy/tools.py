"""Which MCP tools a caller may call: the allow/deny glob rules of the gateway's ``mcp.access``.

One implementation for the gateway (each tool call, each ``tools/list`` entry) and for
``policy explain --mcp-server S --tool T``. A rule matches a caller when its key id matches one
of ``keys`` or its team one of ``teams`` (``fnmatch`` globs, case-sensitive), and the server
one of ``servers`` (default ``*``). Deny wins over allow; no matching allow: refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

__all__ = ["ToolVerdict", "check_tool_access"]


@dataclass(frozen=True, slots=True)
class ToolVerdict:
    """Outcome of one access check.

    Attributes:
        allowed: Whether the caller may call the tool.
        reason: The deciding rule and pattern (``access[i] denies 'x*'``), safe to audit.
    """

    allowed: bool
    reason: str


def _match(patterns: Sequence[str], value: str | None) -> str | None:
    if value is None:
        return None
    return next((p for p in patterns if fnmatchcase(value, p)), None)


def check_tool_access(rules: Sequence[Mapping[str, Any]], key_id: str, team: str | None,
                      server: str, tool: str | None) -> ToolVerdict:
    """May the caller call ``tool`` on ``server`` (``tool`` ``None``: any tool at all)?

    Args:
        rules: The ``mcp.access`` rules (``keys``, ``teams``, ``servers``, ``allow``, ``deny``).
        key_id: The caller's key id (or identity subject).
        team: The caller's team.
        server: The server name.
        tool: The tool name.
    """
    allowed_by: str | None = None
    for i, rule in enumerate(rules):
        if not (_match(rule.get("keys") or (), key_id) or _match(rule.get("teams") or (), team)):
            continue
        if not _match(rule.get("servers") or ("*",), server):
            continue
        if tool is None:
            if rule.get("allow"):
                return ToolVerdict(True, f"access[{i}] allows some tools of {server}")
            continue
        denied = _match(rule.get("deny") or (), tool)
        if denied is not None:
            return ToolVerdict(False, f"access[{i}] denies {denied!r}")
        allowed = _match(rule.get("allow") or (), tool)
        if allowed is not None and allowed_by is None:
            allowed_by = f"access[{i}] allows {allowed!r}"
    if allowed_by is None:
        return ToolVerdict(False, f"no access rule lets key {key_id} call "
                                  f"{tool if tool is not None else 'any tool'!r} on {server}")
    return ToolVerdict(True, allowed_by)
