"""What an MCP caller may use: the allow/deny glob rules of the gateway's ``mcp.access``.

One implementation for the gateway (each tool call, prompt, resource read, each listed entry)
and for ``policy explain --mcp-server S --tool T``. A rule matches a caller when its key id
matches one of ``keys`` or its team one of ``teams`` (``fnmatch`` globs, case-sensitive), and
the server one of ``servers`` (default ``*``). Tools are judged by the rule's ``allow``/``deny``,
prompts (by name) by ``prompts.allow``/``prompts.deny``, resources (by URI) by
``resources.allow``/``resources.deny``. Deny wins over allow; no matching allow: refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

__all__ = ["KINDS", "ToolVerdict", "check_access", "check_tool_access"]

KINDS = ("tool", "prompt", "resource")
"""What an access rule governs: tools (``allow``/``deny``), prompts, resources."""


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


def _globs(rule: Mapping[str, Any], kind: str, which: str) -> Sequence[str]:
    if kind == "tool":
        return rule.get(which) or ()
    section = rule.get(kind + "s")
    return (section.get(which) or ()) if isinstance(section, Mapping) else ()


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
    return check_access(rules, key_id, team, server, "tool", tool)


def check_access(rules: Sequence[Mapping[str, Any]], key_id: str, team: str | None,
                 server: str, kind: str, name: str | None) -> ToolVerdict:
    """May the caller use the ``kind`` named ``name`` on ``server``?

    Args:
        rules: The ``mcp.access`` rules (``keys``, ``teams``, ``servers``, ``allow``/``deny``
            for tools, ``prompts``/``resources`` each with ``allow``/``deny``).
        key_id: The caller's key id (or identity subject).
        team: The caller's team.
        server: The server name.
        kind: One of :data:`KINDS`.
        name: The tool or prompt name, or the resource URI; ``None``: any of ``kind``.

    Raises:
        ValueError: ``kind`` is not one of :data:`KINDS`.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown access kind {kind!r}")
    what = {"tool": "call", "prompt": "get prompt", "resource": "read resource"}[kind]
    label = "" if kind == "tool" else kind + " "  # tool reasons keep their original wording
    allowed_by: str | None = None
    for i, rule in enumerate(rules):
        if not (_match(rule.get("keys") or (), key_id) or _match(rule.get("teams") or (), team)):
            continue
        if not _match(rule.get("servers") or ("*",), server):
            continue
        if name is None:
            if _globs(rule, kind, "allow"):
                return ToolVerdict(True, f"access[{i}] allows some {kind}s of {server}")
            continue
        denied = _match(_globs(rule, kind, "deny"), name)
        if denied is not None:
            return ToolVerdict(False, f"access[{i}] denies {label}{denied!r}")
        allowed = _match(_globs(rule, kind, "allow"), name)
        if allowed is not None and allowed_by is None:
            allowed_by = f"access[{i}] allows {label}{allowed!r}"
    if allowed_by is None:
        target = repr(name) if name is not None else f"any {kind}"
        return ToolVerdict(False, f"no access rule lets key {key_id} {what} {target} on {server}")
    return ToolVerdict(True, allowed_by)
