"""The checks of one MCP message before it is forwarded: data class, ``tools/call`` arguments,
sensitive data.

:class:`MessageChecks` holds what the checks judge by (the ``mcp:`` section, the access rules,
the tool catalogue, the egress policy and its address matcher); :meth:`MessageChecks.rebound`
gives a copy for a new policy revision. The endpoint (:mod:`gateway.mcp.endpoint`) and the
aggregate endpoint (:mod:`gateway.mcp.aggregate`) call them in the order the endpoint's module
docstring gives.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from typing import Any

from gateway.mcp.access import ToolAccess
from gateway.mcp.arguments import argument_bytes, check_schema, check_size, check_url_arguments
from gateway.mcp.catalogue import Catalogue
from gateway.mcp.jsonrpc import FORBIDDEN, INVALID_PARAMS, McpRefusal, Message
from gateway.mcp.params import check_params, mirror_params
from gateway.mcp.pii import ArgumentScan, refusal_record, scan_arguments
from gateway.mcp.records import CallRecord
from gateway.mcp.settings import McpSettings
from gateway.mcp.upstream import Link, Upstream
from policy import EgressMatcher, Policy
from policy import Principal as PolicyPrincipal

__all__ = ["MessageChecks"]


class MessageChecks:
    """The checks of a message to one of the declared servers (see the module docstring).

    Args:
        settings: The ``mcp:`` section (argument limits, per-tool declarations).
        access: The ``mcp.access`` rules.
        catalogue: The servers' tool catalogues (tool exists, ``inputSchema``).
        policy: The egress policy (``None``: no policy; URL arguments are then refused).
        matcher: The address checks shared with the process guard.
    """

    def __init__(self, settings: McpSettings, access: ToolAccess, catalogue: Catalogue,
                 policy: Policy | None, matcher: EgressMatcher | None) -> None:
        self.settings = settings
        self.access = access
        self.catalogue = catalogue
        self._policy = policy
        self._matcher = matcher

    def rebound(self, policy: Policy | None) -> MessageChecks:
        """A copy judging by ``policy`` (a live reload's new revision)."""
        other = copy.copy(self)
        other._policy = policy
        return other

    async def scan_message(self, upstream: Upstream, principal: Any, msg: Message, body: bytes,
                           rec: CallRecord) -> tuple[Any, bytes]:
        """Apply the policy's ``pii`` section to a message other than ``tools/call``
        (:meth:`_scan_message`; no ``pii`` section: the message as it is)."""
        pii = self._policy.pii if self._policy is not None else None
        if pii is None:
            return principal, body
        return await self._scan_message(pii, upstream, principal, msg, body, rec)

    def check_class(self, principal: Any, upstream: Upstream, rec: CallRecord) -> None:
        """Refuse when the server's destination may not receive the caller's data class.

        Raises:
            McpRefusal: 403 ``class_refused`` (the policy's reason in the message).
        """
        if self._policy is None:
            return
        dest = upstream.settings.destination or ""
        decision = self._policy.evaluate(PolicyPrincipal(principal.key_id, principal.team),
                                         principal.data_class, dest)
        if not decision.allowed:
            raise McpRefusal(403, FORBIDDEN, "class_refused",
                             f"MCP server {upstream.name} (destination {dest}) may not receive "
                             f"data class {principal.data_class}: {decision.reason}")

    async def check_call(self, state: Any, upstream: Upstream, principal: Any, msg: Message,
                         body: bytes, rec: CallRecord, client_params: list[tuple[str, str]]
                         | None) -> tuple[Any, bytes, dict[str, str]]:
        """Check a ``tools/call``.

        Args:
            client_params: The request's ``Mcp-Param-*`` lines, checked against the
                arguments (:mod:`gateway.mcp.params`); ``None``: not checked (a 2025 request).

        Returns:
            The principal (class raised by detected sensitive data), the body to forward
            (arguments masked by the ``pii`` section) and the ``Mcp-Param-*`` headers to send
            with it (rebuilt from the forwarded arguments; the client's are never relayed).

        Raises:
            McpRefusal: The call is refused (see the module docstring's order).
        """
        tool = msg.name or ""
        verdict = self.access.check(principal.key_id, principal.team, upstream.name, tool)
        if not verdict.allowed:
            raise McpRefusal(403, FORBIDDEN, "tool_denied", verdict.reason)
        arguments = msg.params.get("arguments", {})
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise McpRefusal(400, INVALID_PARAMS, "invalid_params", "arguments must be an object")
        encoded = argument_bytes(arguments)
        rec.arguments_sha256 = hashlib.sha256(encoded).hexdigest()
        declared = upstream.settings.tools.get(tool)
        limit = self.settings.limits.max_argument_bytes
        if declared is not None and declared.max_argument_bytes is not None:
            limit = min(limit, declared.max_argument_bytes)
        check_size(encoded, limit)
        others = {k: v for k, v in msg.params.items() if k not in ("name", "arguments")}
        if others:  # _meta or another key
            rest = argument_bytes(others)
            rec.params_sha256 = hashlib.sha256(rest).hexdigest()
            check_size(rest, limit, "params")  # forwarded too: bounded as the arguments
        sent = arguments
        pii = self._policy.pii if self._policy is not None else None
        if pii is not None:
            principal, body, arguments = await self._scan_arguments(
                pii, upstream, principal, msg, arguments, body, rec)
        catalogue = (self.catalogue.cached(upstream)
                     or await self.catalogue.get(upstream, Link.of(state)))
        definition = catalogue.tools.get(tool)
        if definition is None:
            raise McpRefusal(400, INVALID_PARAMS, "unknown_tool",
                             f"MCP server {upstream.name} has no tool {tool!r}")
        schema = definition.get("inputSchema")
        annotations = catalogue.annotations(tool)
        if client_params is not None:
            check_params(annotations, sent, client_params)
        check_schema(arguments, schema if isinstance(schema, dict) else None,
                     catalogue.validator(tool))
        if declared is not None and declared.url_arguments:
            await check_url_arguments(arguments, declared.url_arguments, self._matcher,
                                      self._policy,
                                      PolicyPrincipal(principal.key_id, principal.team),
                                      principal.data_class, schemes=declared.url_schemes)
        return principal, body, mirror_params(annotations, arguments)

    async def _scan_arguments(self, pii: Any, upstream: Upstream, principal: Any, msg: Message,
                              arguments: dict[str, Any], body: bytes, rec: CallRecord,
                              ) -> tuple[Any, bytes, dict[str, Any]]:
        """Apply the ``pii`` section (:mod:`gateway.mcp.pii`) to everything the call forwards
        but the tool name (checked against the catalogue): the arguments, ``_meta`` (the
        progress token, protocol and custom keys; the reserved keys' values are free-form
        too) and any other ``params`` key."""
        content = {k: v for k, v in msg.params.items() if k != "name"}
        content["arguments"] = arguments
        principal, scan = await self._apply_pii(pii, upstream, principal, content, rec,
                                                record_clean=True)
        if scan.masked:
            obj = dict(msg.obj)
            obj["params"] = {**msg.params, **scan.arguments}
            body = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            arguments = scan.arguments["arguments"]
        return principal, body, arguments

    async def _scan_message(self, pii: Any, upstream: Upstream, principal: Any, msg: Message,
                            body: bytes, rec: CallRecord) -> tuple[Any, bytes]:
        """Apply the ``pii`` section to a message other than ``tools/call`` (whose arguments
        :meth:`check_call` scans): the ``params`` of a request or notification (``prompts/get``
        arguments, ``completion/complete`` values, ``notifications/message`` data...) and the
        ``result``/``error`` of a client's response, ``_meta`` included (a progress token or a
        custom key is forwarded as any other value). The same actions as for tool arguments:
        class raised and the destination checked again, masked, refused.

        Returns:
            The principal (class raised) and the body to forward (masked where the policy
            masks, else the client's bytes).

        Raises:
            McpRefusal: 403 ``pii_refused``, 503 ``pii_scan_failed`` (unscanned, see
                :mod:`gateway.mcp.pii`), or
                403 ``class_refused`` when the raised class may not go to this server.
        """
        content: dict[str, Any] = {}
        for part in ("params", "result", "error"):
            value = msg.obj.get(part)
            if value not in (None, {}, []):
                content[part] = value
        if not content:
            return principal, body
        principal, scan = await self._apply_pii(pii, upstream, principal, content, rec,
                                                record_clean=False)
        if scan.masked:
            obj = {**msg.obj, **scan.arguments}
            body = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return principal, body

    async def _apply_pii(self, pii: Any, upstream: Upstream, principal: Any,
                         content: dict[str, Any], rec: CallRecord, *, record_clean: bool,
                         ) -> tuple[Any, ArgumentScan]:
        """Scan ``content`` (:func:`gateway.mcp.pii.scan_arguments`), put the verdict in
        ``rec`` and, when the class was raised, check this server's destination again.

        Args:
            record_clean: Put the verdict in ``rec`` even when nothing was found (a tool
                call's record always carries it; another message is recorded only when
                something was found, :meth:`record`).

        Returns:
            The principal with the class after detection, and the scan (masked content).

        Raises:
            McpRefusal: ``pii_refused``/``pii_scan_failed`` (the verdict recorded), or
                ``class_refused`` for the raised class.
        """
        try:
            scan = await scan_arguments(pii, content, principal.key_id, principal.team,
                                        principal.data_class)
        except McpRefusal as exc:
            rec.pii = refusal_record(exc)
            raise
        if record_clean or scan.record.get("entities"):
            rec.pii = scan.record
        if scan.data_class != principal.data_class:
            principal = dataclasses.replace(principal, data_class=scan.data_class)
            rec.data_class = scan.data_class
            self.check_class(principal, upstream, rec)
        return principal, scan
