"""An agent session as one timeline: model calls and tool calls linked by W3C trace id.

A chat completion's ``request.started`` record and the MCP ``mcp.tool_call``/``mcp.refused``
records of the tool calls its answer asked for share the client's trace id (the agent sends
the same ``traceparent`` with both). :func:`session_timeline` selects the records of one trace
(or one key) and joins each model call's start with its completion.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.audit.records import Record

__all__ = ["TimelineEntry", "session_timeline"]

_MODEL_TYPES = ("request.started", "request.denied")
_TOOL_TYPES = ("mcp.started", "mcp.tool_call", "mcp.refused")
_UNDELIVERED_TYPES = ("request.undelivered", "mcp.undelivered")
"""Follow-ups of a completed step whose client left before the end of its answer went out
(docs/audit.md "What the client got"): they amend the step's detail, by ``request_id``."""
_NO_ANSWER = "no answer recorded"
"""Detail of a tool call whose ``mcp.started`` has no ``mcp.tool_call`` (yet): it left for
its server and nobody saw its answer (the gateway stopped, or the call is in flight)."""
_PLUMBING = frozenset({None, "DELETE", "initialize", "ping", "server/discover",
                       "logging/setLevel"})
"""MCP methods of the protocol itself (with ``notifications/*`` and the ``*/list`` methods):
their allowed records are in the chain, but no step of the agent's actions (a refusal is)."""


def _plumbing(kind: str, data: dict[str, Any]) -> bool:
    """An allowed MCP protocol message (handshake, list, notification, client response)."""
    if kind not in ("mcp.started", "mcp.tool_call") or data.get("reason") is not None:
        return False
    method = data.get("mcp_method")
    return method in _PLUMBING or (isinstance(method, str) and (
        method.startswith("notifications/") or method.endswith("/list")))


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One step of a session.

    Attributes:
        ts_us: Record time (microseconds since the Unix epoch).
        kind: ``model`` or ``tool``.
        key_id: The caller.
        what: The model, or ``server/tool`` (``server method`` for non-call refusals).
        decision: ``allow`` or ``deny``.
        status: HTTP status (model calls: of the completion record).
        detail: Reason of a refusal or failure, token counts of a model call.
        trace_id: The W3C trace id.
        ref: ``chain#seq`` of the record.
    """

    ts_us: int
    kind: str
    key_id: str | None
    what: str
    decision: str | None
    status: int | None
    detail: str
    trace_id: str | None
    ref: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {k: getattr(self, k) for k in self.__slots__}


def session_timeline(records: Iterable[Record], trace_id: str | None = None,
                     key_id: str | None = None) -> list[TimelineEntry]:
    """The model and tool calls of one trace (or of one key), in record order (allowed MCP
    protocol messages, ``initialize``, lists, notifications, left out: :func:`_plumbing`).

    A step is placed by its first record (``request.started``, ``mcp.started``) and completed
    by its last (``request.completed``, ``mcp.tool_call``); a tool call with no answer record
    says so (:data:`_NO_ANSWER`); a follow-up ``request.undelivered`` / ``mcp.undelivered``
    adds to the step's detail that its client left before the end, and the bytes it got.

    Args:
        records: Records in chain order (``export_records``).
        trace_id: Keep the steps of this trace (32 hex).
        key_id: Keep the steps of this key (with or without ``trace_id``).
    """
    entries: list[TimelineEntry] = []
    started: dict[str, int] = {}
    placed: dict[str, int] = {}  # request id -> its step (for the follow-ups)
    for rec in records:
        kind = rec.type
        data = rec.decoded()["data"]
        if kind in _UNDELIVERED_TYPES:
            at = placed.get(str(data.get("request_id")))
            if at is not None:
                e = entries[at]
                detail = (f"{e.detail} undelivered: client_disconnect after "
                          f"{data.get('bytes_out')} of {data.get('bytes_recorded')} bytes")
                entries[at] = TimelineEntry(e.ts_us, e.kind, e.key_id, e.what, e.decision,
                                            e.status, detail.strip(), e.trace_id, e.ref)
            continue
        if kind == "request.completed":
            at = started.pop(str(data.get("request_id")), None)
            if at is not None:
                e = entries[at]
                detail = (f"outcome={data.get('outcome')} tokens={data.get('input_tokens')}/"
                          f"{data.get('output_tokens')}")
                entries[at] = TimelineEntry(e.ts_us, e.kind, e.key_id, e.what, e.decision,
                                            data.get("status"), detail, e.trace_id, e.ref)
            continue
        if kind not in _MODEL_TYPES and kind not in _TOOL_TYPES:
            continue
        if trace_id is not None and data.get("trace_id") != trace_id:
            continue
        if key_id is not None and data.get("key_id") != key_id:
            continue
        if _plumbing(kind, data):
            continue
        ref = f"{rec.chain}#{rec.seq}"
        at = started.pop(str(data.get("request_id")), None) if kind == "mcp.tool_call" else None
        placed[str(data.get("request_id"))] = at if at is not None else len(entries)
        if kind in _MODEL_TYPES:
            entry = TimelineEntry(rec.ts_us, "model", data.get("key_id"),
                                  str(data.get("canonical_model") or data.get("model")),
                                  data.get("decision"), data.get("status"),
                                  str(data.get("error_code") or ""), data.get("trace_id"), ref)
            if kind == "request.started":
                started[str(data.get("request_id"))] = len(entries)
        else:
            what = f"{data.get('server')}/{data.get('tool')}" if data.get("tool") else (
                f"{data.get('server')} {data.get('mcp_method')}")
            detail = str(data.get("reason") or "")
            if data.get("duration_us") is not None:
                detail = f"{detail} {int(data['duration_us']) // 1000}ms".strip()
            if kind == "mcp.started":
                detail = _NO_ANSWER
            entry = TimelineEntry(rec.ts_us, "tool", data.get("key_id"), what,
                                  data.get("decision"), data.get("status"), detail,
                                  data.get("trace_id"), ref)
            if at is not None:  # the answer of a call placed by its mcp.started
                first = entries[at]
                entries[at] = TimelineEntry(first.ts_us, "tool", entry.key_id, entry.what,
                                            entry.decision, entry.status, entry.detail,
                                            entry.trace_id, first.ref)
                continue
            if kind == "mcp.started":
                started[str(data.get("request_id"))] = len(entries)
        entries.append(entry)
    return entries
