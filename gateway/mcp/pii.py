"""Sensitive data in MCP tool arguments: the policy's ``pii`` section applied to ``tools/call``.

A tool call's ``arguments`` pass the same detection as a model request's prompt
(:mod:`gateway.pii.request`, :mod:`policy.pii.inspect`), before the call's destination check is
repeated and before anything is forwarded. Object keys are scanned as well as values (an
argument's name can carry a card number as well as its value can; a schema that allows extra
properties lets any name through), and so are long integers and the text of ``data:`` URLs and
base64 strings (:mod:`policy.pii.engine`); a ``mask`` of a match in a name, a number or an
encoded text refuses the call instead:

* ``raise``: the call's data class becomes the raised class, and the server's destination is
  checked again for it (a server that may not receive the raised class is refused, 403);
* ``mask``: each match becomes ``<ENTITY>`` in the forwarded arguments (also for rules marked
  ``reversible``: a tool's result is not mapped back, so the plain placeholder is used); a
  match in an argument's name cannot be masked (the arguments' shape would change, and two
  masked names may collide), so the call is refused (403 ``pii_refused``) instead;
* ``refuse``: 403 with a JSON-RPC error naming the entity types, never the values;
* ``record``: only the record.

A scan that did not finish (detector failure, ``timeout_s``, ``max_scan_chars``, the scan pool
full) is decided as if every entity type had been found (:meth:`policy.PiiPolicy.unscanned`):
503 ``pii_scan_failed`` for the classes the policy fails closed for and where a ``mask`` or
``refuse`` action could apply; otherwise the call's class is raised to the most sensitive one
a ``raise`` could give and the destination checked again. The verdict goes into the call's
audit record (entity types and counts, ``in_keys`` for findings in names, class before and
after, actions; never the text, never a name that held a finding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.mcp.jsonrpc import FORBIDDEN, INTERNAL_ERROR, McpRefusal
from policy import PiiPolicy, PiiRefused, PiiScanFailed, PiiVerdict

__all__ = ["ArgumentScan", "refusal_record", "scan_arguments"]


@dataclass(frozen=True, slots=True)
class ArgumentScan:
    """The outcome of scanning one call's arguments.

    Attributes:
        arguments: the arguments to forward (masked where the policy masks; else the same
            object that was scanned).
        masked: whether ``arguments`` differ from what the client sent.
        data_class: the call's class after ``raise`` actions.
        record: the audit form of the verdict (``pii`` of the call's record).
    """

    arguments: dict[str, Any]
    masked: bool
    data_class: str
    record: dict[str, Any]


async def scan_arguments(pii: PiiPolicy, arguments: dict[str, Any], key_id: str,
                         team: str | None, data_class: str) -> ArgumentScan:
    """Scan a tool call's ``arguments`` and apply the policy's decision.

    Args:
        pii: the policy's ``pii`` section (its detector built at start-up).
        arguments: the call's ``params.arguments`` (object keys and values are scanned).
        key_id: the caller's key id (rules by key).
        team: the caller's team (rules by team).
        data_class: the call's class before detection.

    Returns:
        The arguments to forward, the class after detection and the audit record.

    Raises:
        McpRefusal: 403 ``pii_refused`` (the entity types named, never a value), or 503
            ``pii_scan_failed`` when the scan did not finish and the call cannot pass
            unscanned (:meth:`policy.PiiPolicy.unscanned`); the verdict's audit form is
            read from it by :func:`refusal_record`.
    """
    try:
        verdict = await pii.inspect_async(arguments, key_id, team, data_class)
    except PiiRefused as exc:
        record = exc.verdict.as_record() if isinstance(exc.verdict, PiiVerdict) else {}
        raise _Refused(403, FORBIDDEN, "pii_refused", exc.message, record) from exc
    except PiiScanFailed as exc:
        record = {"entities": {}, "actions": {}, "rules": {}, "class_before": data_class,
                  "class_after": data_class, "error": exc.code}
        raise _Refused(503, INTERNAL_ERROR, "pii_scan_failed", exc.message, record) from exc
    forwarded = arguments
    if verdict.to_mask:
        forwarded = PiiPolicy.masked(arguments, verdict)
    return ArgumentScan(forwarded, forwarded is not arguments, verdict.class_after,
                        verdict.as_record())


class _Refused(McpRefusal):
    """A refusal by the ``pii`` section, carrying the verdict's audit form."""

    def __init__(self, status: int, rpc_code: int, reason: str, message: str,
                 record: dict[str, Any]) -> None:
        super().__init__(status, rpc_code, reason, message)
        self.record = record


def refusal_record(exc: McpRefusal) -> dict[str, Any] | None:
    """The ``pii`` audit form a refusal of :func:`scan_arguments` carries (else ``None``)."""
    return exc.record if isinstance(exc, _Refused) else None
