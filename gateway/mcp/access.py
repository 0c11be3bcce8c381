"""Per-caller authorisation of MCP tools, prompts and resources (globs of ``mcp.access``).

Built on the authenticated principal (key id, team), so a principal issued from an identity
token is judged the same way as one from an API key. The rule semantics are
:func:`policy.check_access` (shared with ``policy explain``): deny wins, no match refuses.

A resource URI is judged in every form a server might read it as (:func:`uri_forms`): the URI
as sent and its normal form (percent-decoding undone, scheme and authority in lower case,
repeated slashes collapsed); each form must be allowed, so ``deny: ["file:///etc/*"]`` also
holds against ``FILE:///etc/passwd``, ``file:///%65tc/passwd`` or ``file:////etc/passwd``. A
URI with a dot segment (``/../``, encoded or not), a backslash, whitespace or a control
character is refused whatever the rules say: globs cannot say where such a path ends up.

The rules are fixed for the life of a :class:`ToolAccess` (``mcp:`` is restart-only), so a
verdict depends only on (key id, team, server, kind, name) and is kept once computed: the glob
matching runs once per caller and name, not per call. The memo is bounded
(:data:`MEMO_ENTRIES`; emptied when full), so callers naming ever new names cannot grow it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fnmatch import fnmatchcase
from urllib.parse import unquote

from gateway.mcp.settings import McpAccessRule
from policy import KINDS, ToolVerdict, check_access

__all__ = ["MEMO_ENTRIES", "ToolAccess", "ToolVerdict", "uri_forms"]

MEMO_ENTRIES = 4096
"""Most verdicts kept (key id, team, server, kind, name); emptied when it is full."""

_DECODE_ROUNDS = 4
_UNSAFE = re.compile(r"[\x00-\x20\x7f\\]")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_AUTHORITY = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:)(//[^/?#]*)?(.*)$", re.DOTALL)


def uri_forms(uri: str) -> tuple[str, ...] | None:
    """The forms of a resource URI that the access globs must all allow.

    Returns:
        ``(uri,)`` or ``(uri, normal form)`` (scheme and host lower-cased, repeated slashes
        collapsed, a local ``file:`` URI as ``file:///path``); ``None`` when the URI is
        refused outright (a dot segment, backslash, whitespace or control character, in the
        URI or once decoded, encoded bytes that are not UTF-8, or still percent-encoded after
        four rounds).
    """
    decoded = uri
    for _ in range(_DECODE_ROUNDS):
        if _UNSAFE.search(decoded):
            return None
        try:
            step = unquote(decoded, errors="strict") if "%" in decoded else decoded
        except UnicodeDecodeError:  # bytes that are not UTF-8: no form to judge
            return None
        if step == decoded:
            break
        decoded = step
    else:
        return None
    m = _AUTHORITY.match(decoded)
    if m is None:
        normal = decoded
        path = decoded
    else:
        scheme, authority, path = m.group(1), m.group(2) or "", m.group(3)
        path = re.sub(r"/{2,}", "/", path)
        normal = scheme.lower() + authority.lower() + path
        if scheme.lower() == "file:" and authority.lower() in ("", "//", "//localhost"):
            # RFC 8089: file:/p, file:///p and file://localhost/p name the same local file.
            normal = "file://" + (path if path.startswith("/") else "/" + path)
    segments = re.split(r"[/?#]", path)
    if "." in segments or ".." in segments:
        return None
    return (uri,) if normal == uri else (uri, normal)


class ToolAccess:
    """The ``mcp.access`` rules, evaluated per (caller, server, kind, name).

    Args:
        rules: The rules in configuration order.
    """

    def __init__(self, rules: Sequence[McpAccessRule]) -> None:
        self._rules = [r.model_dump() for r in rules]
        self._memo: dict[tuple[str, str | None, str, str, str | None], ToolVerdict] = {}
        self._schemes: dict[tuple[str, str | None, str, str, None], frozenset[str]] = {}

    def may_use_server(self, key_id: str, team: str | None, server: str) -> bool:
        """True when some rule for ``server`` lets the caller use some tool, prompt or
        resource (the condition for the protocol's own messages: ``initialize``, ``ping``...)."""
        return any(self._verdict(key_id, team, server, kind, None).allowed for kind in KINDS)

    def may_use_tools(self, key_id: str, team: str | None, server: str) -> bool:
        """True when some rule for ``server`` lets the caller call some tool."""
        return self._verdict(key_id, team, server, "tool", None).allowed

    def check(self, key_id: str, team: str | None, server: str, tool: str) -> ToolVerdict:
        """May the caller call ``tool`` on ``server``? The verdict names the deciding rule."""
        return self._verdict(key_id, team, server, "tool", tool)

    def check_prompt(self, key_id: str, team: str | None, server: str,
                     prompt: str) -> ToolVerdict:
        """May the caller get (list, complete) the prompt named ``prompt`` on ``server``?"""
        return self._verdict(key_id, team, server, "prompt", prompt)

    def check_resource(self, key_id: str, team: str | None, server: str,
                       uri: str) -> ToolVerdict:
        """May the caller read (list, subscribe to, complete) the resource ``uri`` (or a
        template's ``uriTemplate``) on ``server``? Every form of :func:`uri_forms` must be
        allowed; a URI it refuses is refused here."""
        key = (key_id, team, server, "resource", uri)
        verdict = self._memo.get(key)
        if verdict is None:
            forms = uri_forms(uri)
            if forms is None:
                verdict = ToolVerdict(False, "resource URI with a dot segment, backslash, "
                                             "whitespace or control character")
            else:
                verdict = ToolVerdict(True, "")
                for form in forms:
                    verdict = check_access(self._rules, key_id, team, server, "resource", form)
                    if not verdict.allowed:
                        break
            self._remember(key, verdict)
        return verdict

    def resource_schemes(self, key_id: str, team: str | None, server: str) -> frozenset[str]:
        """The URI schemes (lower case) spelled literally at the start of the ``resources``
        globs (allow and deny) of the rules that match the caller and ``server``: the URIs
        :mod:`gateway.mcp.uritext` looks for in free text (a glob starting with a wildcard
        names none)."""
        key = (key_id, team, server, "schemes", None)
        memo = self._schemes.get(key)
        if memo is not None:
            return memo
        found: set[str] = set()
        for rule in self._rules:
            if not (any(fnmatchcase(key_id, p) for p in rule.get("keys") or ())
                    or (team is not None
                        and any(fnmatchcase(team, p) for p in rule.get("teams") or ()))):
                continue
            if not any(fnmatchcase(server, p) for p in rule.get("servers") or ("*",)):
                continue
            globs = rule.get("resources") or {}
            for glob in (*(globs.get("allow") or ()), *(globs.get("deny") or ())):
                m = _SCHEME.match(glob)
                if m is not None:
                    found.add(m.group(1).lower())
        if len(self._schemes) >= MEMO_ENTRIES:
            self._schemes.clear()
        memo = self._schemes[key] = frozenset(found)
        return memo

    def _verdict(self, key_id: str, team: str | None, server: str, kind: str,
                 name: str | None) -> ToolVerdict:
        key = (key_id, team, server, kind, name)
        verdict = self._memo.get(key)
        if verdict is None:
            verdict = check_access(self._rules, key_id, team, server, kind, name)
            self._remember(key, verdict)
        return verdict

    def _remember(self, key: tuple[str, str | None, str, str, str | None],
                  verdict: ToolVerdict) -> None:
        if len(self._memo) >= MEMO_ENTRIES:
            self._memo.clear()
        self._memo[key] = verdict
