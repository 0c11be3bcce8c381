"""Withholding, from a server's answer, the resources the caller may not read.

The ``resources`` globs of ``mcp.access`` govern what a caller may ask for; this module
governs what a server may hand back (:class:`ResourceSieve`, applied to every relayed message
by :class:`gateway.mcp.answers.AnswerRelay`):

* a content item anywhere in a message (``tools/call`` and ``prompts/get`` results, a
  server's requests and notifications) that is a ``resource_link`` (``{"type":
  "resource_link", "uri"}``) or an embedded ``resource`` (``{"type": "resource",
  "resource": {"uri"}}``) whose URI the caller may not read is replaced by a text item,
  :data:`PLACEHOLDER` (the content list keeps its length, so the client sees that
  something was held back, and never which URI);
* an entry of a ``resources/read`` result's ``contents`` whose URI the caller may not read is
  removed (a resource contents list has no item for a placeholder);
* a ``notifications/resources/updated`` for such a URI is dropped, and so is one for a URI
  the caller did not subscribe to through the gateway (:mod:`gateway.mcp.subscriptions`);
* with ``mcp.uri_text`` ``redact`` (the default) or ``refuse``, a URI of a scheme the caller's
  ``resources`` globs name, inside any string of the message (``text`` items,
  ``structuredContent``, ``_meta``, descriptions), is judged too (:mod:`gateway.mcp.uritext`):
  ``redact`` replaces a refused one by :data:`gateway.mcp.uritext.REDACTED`; ``refuse`` turns
  a response naming one into a JSON-RPC error (:data:`TEXT_REFUSED`) and drops a notification
  or server request naming one.

Every withheld item, notification and URI is counted for the audit record (:class:`Withheld`:
the rules, never the URIs). A message in whose bytes no ``"uri"`` key can be spelled
(:func:`may_name_uris`: the key as written, or with ``\\u`` escapes) nor a URI of a judged
scheme (:meth:`ResourceSieve.may_withhold`) is relayed as it came, unparsed again and
unchanged.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.mcp.access import ToolVerdict
from gateway.mcp.jsonrpc import FORBIDDEN
from gateway.mcp.uritext import UriText

__all__ = ["NOT_SUBSCRIBED", "PLACEHOLDER", "TEXT_REFUSED", "ResourceSieve", "Withheld",
           "may_name_uris"]

PLACEHOLDER = "[resource withheld by the gateway: the caller may not read it (mcp.access)]"
"""The text of the item that stands in for a withheld ``resource_link`` or ``resource``."""

NOT_SUBSCRIBED = "not subscribed through the gateway"
"""The rule of a ``notifications/resources/updated`` for a URI the caller did not subscribe to."""

TEXT_REFUSED = ("the answer names a resource the caller may not read "
                "(mcp.uri_text: refuse)")
"""The message of the JSON-RPC error that replaces such an answer in ``refuse`` mode."""

MAX_DIGESTS = 16
"""Most URI digests one audit record lists (the count is always exact)."""

_ESCAPED_URI = re.compile(rb'"(?:u|\\u0075)(?:r|\\u0072)(?:i|\\u0069)"', re.IGNORECASE)


def may_name_uris(data: bytes) -> bool:
    """False when the JSON text ``data`` cannot hold a ``"uri"`` key (then nothing in it
    can be withheld); true when it may (a cheap byte search, no parse)."""
    return b'"uri"' in data or (b"\\u00" in data and _ESCAPED_URI.search(data) is not None)


def _rule(reason: str) -> str:
    """The deciding rule of a refusal, without the URI (a no-match reason names it)."""
    if reason.startswith("access["):
        return reason  # "access[i] denies resource '<glob>'": configuration, not the URI
    if reason.startswith("no access rule"):
        return "no access rule allows it"
    return reason  # the fixed text of a URI refused outright


@dataclass
class Withheld:
    """What was withheld from one answer: for its audit record (never a URI).

    Attributes:
        count: Items, notifications and URIs in text withheld.
        rules: The deciding rules (each once, in order of first use).
        uri_sha256: SHA-256 (hex) of the withheld URIs, at most :data:`MAX_DIGESTS`.
        in_text: Of ``count``, URIs found in strings (:mod:`gateway.mcp.uritext`).
        refused: Messages refused or dropped for such a URI (``mcp.uri_text: refuse``).
    """

    count: int = 0
    rules: list[str] = field(default_factory=list)
    uri_sha256: list[str] = field(default_factory=list)
    in_text: int = 0
    refused: int = 0

    def note(self, uri: str, reason: str) -> None:
        """Count one withheld item whose URI ``uri`` was refused for ``reason``."""
        self.count += 1
        rule = _rule(reason)
        if rule not in self.rules:
            self.rules.append(rule)
        if len(self.uri_sha256) < MAX_DIGESTS:
            self.uri_sha256.append(
                hashlib.sha256(uri.encode("utf-8", "surrogatepass")).hexdigest())

    def record(self) -> dict[str, Any]:
        """The audit record's ``withheld`` field."""
        out: dict[str, Any] = {"count": self.count, "rules": list(self.rules),
                               "uri_sha256": list(self.uri_sha256)}
        if self.in_text:
            out["in_text"] = self.in_text
        if self.refused:
            out["refused"] = self.refused
        return out


class ResourceSieve:
    """Withholds what one caller may not read from the messages of one answer.

    Args:
        check: The caller's verdict on a resource URI of this server
            (:meth:`gateway.mcp.access.ToolAccess.check_resource`, bound to the caller).
        withheld: Receives the count, rules and digests.
        subscribed: Did the caller subscribe to a URI (:mod:`gateway.mcp.subscriptions`)?
            ``None``: no subscription check (every readable update is relayed).
        text: Finds URIs in strings (``None``: strings are not searched).
        refuse_text: A URI found in a string refuses its message instead of being redacted.
    """

    def __init__(self, check: Callable[[str], ToolVerdict], withheld: Withheld,
                 subscribed: Callable[[str], bool] | None = None, text: UriText | None = None,
                 refuse_text: bool = False) -> None:
        self._check = check
        self.withheld = withheld
        self._subscribed = subscribed
        self._text = text
        self._refuse_text = refuse_text

    def may_withhold(self, data: bytes) -> bool:
        """False when nothing in the JSON text ``data`` can be withheld (no parse needed)."""
        return may_name_uris(data) or (self._text is not None and self._text.may_name(data))

    def _denied(self, uri: Any) -> bool:
        if not isinstance(uri, str):
            return False  # no URI: not a resource item of the schema, nothing to judge
        verdict = self._check(uri)
        if verdict.allowed:
            return False
        self.withheld.note(uri, verdict.reason)
        return True

    def sift(self, message: Any, method: str | None) -> bool | None:
        """Withhold in ``message`` (one parsed JSON-RPC message, changed in place) what the
        caller may not read.

        Args:
            method: The method of the request this message answers (or belongs to):
                ``resources/read`` filters its result's ``contents``.

        Returns:
            ``None``: drop the message (a notification about a withheld or unsubscribed URI,
            a notification or request refused for a URI in its text); ``True``: it was
            changed (encode it again); ``False``: relay it as it came.
        """
        if not isinstance(message, dict):
            return False
        if message.get("method") == "notifications/resources/updated":
            params = message.get("params")
            uri = params.get("uri") if isinstance(params, dict) else None
            if self._denied(uri):
                return None
            if self._subscribed is not None and not (
                    isinstance(uri, str) and self._subscribed(uri)):
                self.withheld.note(uri if isinstance(uri, str) else "", NOT_SUBSCRIBED)
                return None
        before = self.withheld.count
        result = message.get("result")
        if (method == "resources/read" and "id" in message and isinstance(result, dict)
                and isinstance(result.get("contents"), list)):
            result["contents"] = [c for c in result["contents"] if not (
                isinstance(c, dict) and self._denied(c.get("uri")))]
        self._replace_items(message)
        found = 0 if self._text is None else self._text.redact(message, self._check,
                                                                self.withheld.note)
        if found:
            self.withheld.in_text += found
            if self._refuse_text:
                self.withheld.refused += 1
                if "method" in message or "id" not in message:
                    return None  # a notification or server request: not relayed
                rid = message["id"]
                message.clear()
                message.update({"jsonrpc": "2.0", "id": rid, "error": {
                    "code": FORBIDDEN, "message": TEXT_REFUSED}})
        return self.withheld.count != before

    def _replace_items(self, root: dict[str, Any]) -> None:
        """Replace every denied ``resource_link`` / ``resource`` item under ``root``
        (iterative: a deep message cannot exhaust the stack)."""
        stack: list[Any] = [root]
        while stack:
            node = stack.pop()
            children = node.values() if isinstance(node, dict) else node
            if isinstance(node, list):
                for i, item in enumerate(node):
                    if isinstance(item, dict) and self._withheld_item(item):
                        node[i] = {"type": "text", "text": PLACEHOLDER}
            elif isinstance(node, dict):
                for key, item in node.items():
                    if isinstance(item, dict) and self._withheld_item(item):
                        node[key] = {"type": "text", "text": PLACEHOLDER}
            stack.extend(c for c in children if isinstance(c, (dict, list)))

    def _withheld_item(self, item: dict[str, Any]) -> bool:
        kind = item.get("type")
        if kind == "resource_link":
            return self._denied(item.get("uri"))
        if kind == "resource":
            inner = item.get("resource")
            return self._denied(inner.get("uri") if isinstance(inner, dict) else None)
        return False
