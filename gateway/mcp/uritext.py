"""Resource URIs named in the free text of a server's answer (``mcp.uri_text``).

A ``resource_link`` or embedded ``resource`` item has a ``uri`` the schema defines; the
gateway withholds those exactly (:mod:`gateway.mcp.withhold`). A URI can also sit in any
string: a ``text`` item, ``structuredContent`` (an object of any shape), ``_meta``, a list
entry's description, an error message. No schema says which strings are URIs, so the gateway
can only look for them, and only for what the operator named: a string is searched for URIs
of the **schemes spelled literally** at the start of the caller's ``resources`` globs for this
server (:meth:`gateway.mcp.access.ToolAccess.resource_schemes`: ``docs://public/*`` and
``FILE:///etc/*`` give ``docs`` and ``file``; a glob starting with a wildcard gives none).
Each URI found (up to whitespace, quotes, ``<>``, ``\\``, ``^``, backquote, ``{|}``; a URI
template, where ``{`` follows, is not a URI) is judged with the caller's ``resources`` rules,
without trailing punctuation (``.,;:!?)]'``, kept in the text) and as found; if either is
refused it is replaced by :data:`REDACTED`.

What this cannot see: a URI of another scheme, a URI split across strings, encoded
(base64 ``blob``, percent-encoding of the scheme, a different text form the server will
accept), or described in words. It is a guard against accidental disclosure, not against a
server that means to leak; the enforceable boundary is the server's own destination and data
class (the egress policy) and what the gateway lets the caller read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from gateway.mcp.access import ToolVerdict

__all__ = ["REDACTED", "UriText"]

REDACTED = "[resource URI withheld by the gateway]"
"""What stands in for a URI the caller may not read, inside a string."""

_TRAILING = ".,;:!?)]'"


class UriText:
    """Finds the URIs of some schemes in strings and redacts those the caller may not read.

    Args:
        schemes: The schemes to look for (lower case, non-empty).
    """

    def __init__(self, schemes: Iterable[str]) -> None:
        alts = "|".join(re.escape(s) for s in sorted(schemes))
        self._find = re.compile(
            r"(?<![A-Za-z0-9+.-])(?:" + alts + r"):[^\s\"'<>\\^`{|}]++(?!\{)", re.IGNORECASE)
        self._needles = tuple(s.lower().encode() + b":" for s in sorted(schemes))

    def may_name(self, data: bytes) -> bool:
        """False when the JSON text ``data`` cannot contain such a URI (no parse needed).

        Substring searches in a plain loop: a case-insensitive regular expression, or a
        generator, costs several times more per answer (timeit, one run, loaded machine)."""
        if b"\\u" in data:  # a character of a string may be spelled \uXXXX: parse it
            return True
        low = data.lower()  # ASCII only, as schemes are
        for needle in self._needles:
            if needle in low:
                return True
        return False

    def redact(self, root: Any, check: Callable[[str], ToolVerdict],
               note: Callable[[str, str], None]) -> int:
        """Redact, in place, every refused URI in the strings (values and object keys) under
        ``root`` (iterative: a deep message cannot exhaust the stack).

        Args:
            check: The caller's verdict on a URI.
            note: Called with each refused URI and its reason (audit).

        Returns:
            How many URIs were redacted.
        """
        count = 0

        def fix(text: str) -> str:
            nonlocal count

            def one(m: re.Match[str]) -> str:
                nonlocal count
                token = m.group(0)
                bare = token.rstrip(_TRAILING)
                # The URI without trailing punctuation first (the punctuation is kept), then
                # as found (a server may read "docs://a." as its own name).
                for uri, tail in ((bare, token[len(bare):]), (token, "")):
                    verdict = check(uri)
                    if not verdict.allowed:
                        note(uri, verdict.reason)
                        count += 1
                        return REDACTED + tail
                    if uri == token:
                        break
                return token

            return self._find.sub(one, text)

        stack: list[Any] = [root]
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                for i, item in enumerate(node):
                    if isinstance(item, str):
                        node[i] = fix(item)
                    elif isinstance(item, (dict, list)):
                        stack.append(item)
            elif isinstance(node, dict):
                for key in list(node):
                    item = node[key]
                    if isinstance(item, str):
                        item = node[key] = fix(item)
                    elif isinstance(item, (dict, list)):
                        stack.append(item)
                    new_key = fix(key)
                    if new_key != key:
                        del node[key]
                        while new_key in node:
                            new_key += "'"
                        node[new_key] = item
        return count
