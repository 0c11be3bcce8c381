"""Which client messages reach an upstream server, and under which access rule.

Every message a client sends to ``/mcp/<server>`` is one of these (:func:`check_message`);
anything else is refused (403, ``-32601``, ``method_refused``) and nothing is forwarded, so
a method added to the protocol later is closed until it is governed here:

========================================  ================================================
``tools/call``                            the tool globs (:meth:`MessageChecks.check_call`)
``prompts/get``                           ``prompts`` globs on ``params.name``
``resources/read``, ``resources/subscribe``,
``resources/unsubscribe``                 ``resources`` globs on ``params.uri``
``subscriptions/listen`` (2026-07-28)     ``resources`` globs on each URI of
                                          ``params.notifications.resourceSubscriptions``
``completion/complete``                   ``prompts`` (``ref/prompt``: ``ref.name``) or
                                          ``resources`` (``ref/resource``: ``ref.uri``)
``tools/list``, ``prompts/list``,         forwarded; the answer is filtered to what the
``resources/list``,                       caller may use (:data:`LISTS`)
``resources/templates/list``
``initialize``, ``ping``,                 the protocol itself: the caller needs a rule
``server/discover``, ``logging/setLevel``,  for the server (some tool, prompt or resource)
``notifications/initialized``,
``notifications/cancelled``,
``notifications/progress``,
``notifications/roots/list_changed``,
responses to the server's requests
========================================  ================================================

Not forwarded, among others: ``tasks/*`` (their ids are not bound to the caller), messages
a server sends (``sampling/createMessage``, ``notifications/message``...) sent by a client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.mcp.access import ToolAccess, ToolVerdict
from gateway.mcp.jsonrpc import FORBIDDEN, INVALID_PARAMS, METHOD_NOT_FOUND, McpRefusal, Message
from gateway.mcp.records import CallRecord

__all__ = ["LISTS", "PROTOCOL_METHODS", "check_message", "listed_entries"]

PROTOCOL_METHODS = frozenset({
    "initialize", "ping", "server/discover", "logging/setLevel",
    "notifications/initialized", "notifications/cancelled", "notifications/progress",
    "notifications/roots/list_changed",
})
"""Methods of the protocol itself, forwarded to a caller who may use the server at all."""

LISTS: Mapping[str, tuple[str, str, str]] = {
    "tools/list": ("tools", "name", "tool"),
    "prompts/list": ("prompts", "name", "prompt"),
    "resources/list": ("resources", "uri", "resource"),
    "resources/templates/list": ("resourceTemplates", "uriTemplate", "resource"),
}
"""List methods whose answers are filtered: method -> (result key, entry field, kind)."""

_BY_URI = frozenset({"resources/read", "resources/subscribe", "resources/unsubscribe"})


def _verdict(access: ToolAccess, principal: Any, server: str, kind: str,
             name: str) -> ToolVerdict:
    if kind == "tool":
        return access.check(principal.key_id, principal.team, server, name)
    if kind == "prompt":
        return access.check_prompt(principal.key_id, principal.team, server, name)
    return access.check_resource(principal.key_id, principal.team, server, name)


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise McpRefusal(400, INVALID_PARAMS, "invalid_params", f"{what} must be a string")
    return value


def _require(access: ToolAccess, principal: Any, server: str, kind: str, name: str,
             rec: CallRecord) -> None:
    if kind == "prompt":
        rec.ask("prompt", name)  # confirmed when the server answers it (gateway.mcp.answers)
    else:
        rec.note_resource(name)
    verdict = _verdict(access, principal, server, kind, name)
    if not verdict.allowed:
        raise McpRefusal(403, FORBIDDEN, f"{kind}_denied", verdict.reason)


def check_message(access: ToolAccess, principal: Any, server: str, msg: Message,
                  rec: CallRecord) -> None:
    """Refuse a message other than ``tools/call`` that the caller may not send to ``server``
    (see the module docstring's table); record the prompt name or resource URI digest in
    ``rec``.

    Raises:
        McpRefusal: 403 ``server_denied`` (no rule for the server), ``prompt_denied``,
            ``resource_denied`` (the verdict's rule in the message), ``method_refused``
            (a method the gateway does not forward); 400 ``invalid_params`` (no name or URI
            where the method needs one).
    """
    if not access.may_use_server(principal.key_id, principal.team, server):
        raise McpRefusal(403, FORBIDDEN, "server_denied",
                         f"key {principal.key_id} may not use MCP server {server}")
    method = msg.method
    if method is None or method in PROTOCOL_METHODS or method in LISTS:
        return  # a response to the server's request, the protocol, or a filtered list
    params = msg.params
    if method == "prompts/get":
        _require(access, principal, server, "prompt", _string(params.get("name"), "name"), rec)
    elif method in _BY_URI:
        _require(access, principal, server, "resource", _string(params.get("uri"), "uri"), rec)
    elif method == "subscriptions/listen":
        wanted = params.get("notifications")
        uris = wanted.get("resourceSubscriptions") if isinstance(wanted, dict) else None
        if uris is not None and not isinstance(uris, list):
            raise McpRefusal(400, INVALID_PARAMS, "invalid_params",
                             "resourceSubscriptions must be a list")
        for uri in uris or ():
            _require(access, principal, server, "resource", _string(uri, "a URI"), rec)
    elif method == "completion/complete":
        ref = params.get("ref")
        ref = ref if isinstance(ref, dict) else {}
        if ref.get("type") == "ref/prompt":
            _require(access, principal, server, "prompt", _string(ref.get("name"), "ref.name"),
                     rec)
        elif ref.get("type") == "ref/resource":
            _require(access, principal, server, "resource", _string(ref.get("uri"), "ref.uri"),
                     rec)
        else:
            raise McpRefusal(400, INVALID_PARAMS, "invalid_params",
                             "completion/complete needs a ref/prompt or ref/resource ref")
    else:
        raise McpRefusal(403, METHOD_NOT_FOUND, "method_refused",
                         f"the gateway does not forward {method!r} (not governed by mcp.access)")


def listed_entries(method: str, result: Any, access: ToolAccess, principal: Any,
                   server: str) -> None:
    """Filter a list answer's ``result`` in place to the entries the caller may use
    (``method`` one of :data:`LISTS`; an entry without its name or URI is dropped)."""
    key, field, kind = LISTS[method]
    if isinstance(result, dict) and isinstance(result.get(key), list):
        result[key] = [
            e for e in result[key]
            if isinstance(e, dict) and isinstance(e.get(field), str)
            and _verdict(access, principal, server, kind, e[field]).allowed
        ]
