"""Telemetry of one relay request: its spans, and its metrics handed to the metric set.

:class:`TelemetryObserver` is telemetry's one per-request object (an admission hook and a
request observer; :class:`gateway.telemetry.Telemetry` builds it, the assembly registers it):
it opens and closes the spans through :class:`RequestTracer` and hands the finished record
and each audit append to :class:`gateway.telemetry.metrics.GatewayMetrics`, which folds them
into its instruments when the metrics are read.

Spans: one server span per relay request, one client span per upstream attempt.

Spans follow the OpenTelemetry GenAI semantic conventions
(https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/): name
``"{gen_ai.operation.name} {gen_ai.request.model}"``, ``gen_ai.operation.name``,
``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.usage.input_tokens``,
``gen_ai.usage.output_tokens``, ``gen_ai.request.max_tokens`` (and temperature / top_p),
``server.address``/``server.port`` on client spans, ``error.type`` on failures; plus
``sg.request.id``, ``sg.key.id``, ``sg.data_class``, ``sg.policy.rule_id``,
``sg.policy.decision``, ``sg.policy.revision``, ``sg.destination.id`` and
``sg.destination.region``. Never prompt or completion content. Client-chosen names are
bounded (:mod:`gateway.bounded`): the span name carries a configured model name or ``_OTHER``,
``gen_ai.request.model`` and ``url.path`` an unknown name's bounded form.

Context: the client's W3C ``traceparent``/``tracestate`` is continued (the telemetry's
``on_request`` observer hook extracts it), and each upstream attempt sends its own client
span's ``traceparent`` to vLLM (:meth:`RequestTracer.attempt_started`, called by the relay's
upstream client, injects it; :meth:`RequestTracer.middleware` does the same for aiohttp).
Per-request state lives in a ``ContextVar`` owned by the :class:`RequestTracer` instance
(one task per request).
"""

from __future__ import annotations

import contextvars
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from aiohttp.client_middlewares import ClientHandlerType
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Tracer
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.bounded import OTHER, bounded
from gateway.relay.records import RequestRecord

__all__ = ["ActiveRequest", "MetricsInbox", "RequestTracer", "TelemetryObserver", "operation_name"]

_RETRY_STATUSES = frozenset({429, 502, 503})
_TRACE_HEADERS = (b"traceparent", b"tracestate")

_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "chat",
}


def operation_name(path: str) -> str:
    """``gen_ai.operation.name`` of a request path (``chat``, ``text_completion``, ...).

    ``/v1/models/<id>`` is ``models`` (the id, which may contain ``/``, is not an operation).
    """
    if path.startswith("/v1/models"):
        return "models"
    return _OPERATIONS.get(path) or path.rsplit("/", 1)[-1]


@dataclass(slots=True)
class ActiveRequest:
    """Tracing state of one request (the server span and its open client span)."""

    parent: Context | None
    token: contextvars.Token[ActiveRequest | None] | None = None
    record: RequestRecord | None = None
    params: dict[str, Any] = field(default_factory=dict)
    span: Span | None = None
    client: Span | None = None


def request_model(record: RequestRecord) -> str | None:
    """``gen_ai.request.model`` of ``record``: the name as sent when it resolved to a
    configured model, else :func:`gateway.bounded.bounded` (a client's 200 KB name is not
    copied into every span)."""
    if record.canonical_model is not None:
        return record.model
    return bounded(record.model)


def span_model(record: RequestRecord) -> str:
    """The model in a server span's name (``gen_ai.request.model`` per the semantic
    conventions): the name as sent when it resolved to a configured model (a name, alias or
    served name: a configured set), ``""`` without a model, :data:`gateway.bounded.OTHER`
    for any other name (span names must be of low cardinality)."""
    if record.canonical_model is not None:
        return record.model or record.canonical_model
    return OTHER if record.model else ""


def _request_attributes(record: RequestRecord) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": operation_name(record.path),
        "gen_ai.provider.name": "vllm",
        "http.request.method": record.method,
        "url.path": record.path,
        "sg.request.id": record.request_id,
    }
    optional = {
        "gen_ai.request.model": request_model(record),
        "gen_ai.response.model": record.served_model,
        "sg.key.id": record.key_id,
        "sg.team": record.team,
        "sg.data_class": record.data_class,
        "sg.policy.rule_id": record.policy_rule,
        "sg.policy.decision": record.policy_decision,
        "sg.policy.revision": record.policy_revision,
        "sg.destination.id": record.destination,
        "sg.destination.region": record.region,
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    return attrs


class RequestTracer:
    """Creates the spans of relay requests.

    Args:
        tracer: An SDK tracer (from the gateway's own ``TracerProvider``).
    """

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer
        self._propagator = TraceContextTextMapPropagator()
        self.active: contextvars.ContextVar[ActiveRequest | None] = contextvars.ContextVar(
            "sg_active_request", default=None
        )

    def begin(self, headers: Mapping[str, str]) -> None:
        """Start tracking a request (observer ``on_request``), continuing a client traceparent.

        The request's state lives in this task's context until :meth:`finish`.
        """
        parent = self._propagator.extract(headers) if headers else None
        act = ActiveRequest(parent)
        act.token = self.active.set(act)

    def finish(self) -> None:
        """Stop tracking the current request (after its ``end``)."""
        act = self.active.get()
        if act is not None and act.token is not None:
            try:
                self.active.reset(act.token)
            except ValueError:  # set in another context: forget it there
                self.active.set(None)

    def params(self, body: Mapping[str, Any]) -> None:
        """Keep the request parameters that become span attributes (never content)."""
        act = self.active.get()
        if act is None:
            return
        for src, dst in (("max_tokens", "gen_ai.request.max_tokens"),
                         ("max_completion_tokens", "gen_ai.request.max_tokens"),
                         ("temperature", "gen_ai.request.temperature"),
                         ("top_p", "gen_ai.request.top_p")):
            value = body.get(src)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                act.params[dst] = value
        if body.get("stream") is True:
            act.params["gen_ai.request.stream"] = True  # not content: the request's mode

    def start(self, record: RequestRecord) -> None:
        """Open the server span (backdated to the request start) before forwarding."""
        act = self.active.get()
        if act is None:
            return
        act.record = record
        act.span = self._server_span(act, record)

    def _server_span(self, act: ActiveRequest, record: RequestRecord) -> Span:
        span = self._tracer.start_span(
            f"{operation_name(record.path)} {span_model(record)}".strip(),
            context=act.parent,
            kind=SpanKind.SERVER,
            start_time=int(record.started_at * 1e9),
            attributes={**_request_attributes(record), **act.params},
        )
        ctx = span.get_span_context()
        if ctx.is_valid:
            record.traced(format(ctx.trace_id, "032x"))
        return span

    def end(self, record: RequestRecord) -> None:
        """Close the request's spans with the final attributes (usage, status, errors)."""
        act = self.active.get()
        if act is None:
            return
        span = act.span if act.record is record else None
        if span is None:  # refused before forwarding: a server span all the same
            span = self._server_span(act, record)
        usage = {k: v for k, v in (("gen_ai.usage.input_tokens", record.input_tokens),
                                   ("gen_ai.usage.output_tokens", record.output_tokens))
                 if v is not None}
        failed = record.outcome != "ok"
        error = record.error_code or record.outcome
        if act.client is not None:
            act.client.set_attributes(usage)
            if failed:
                act.client.set_attribute("error.type", error)
                act.client.set_status(Status(StatusCode.ERROR))
            act.client.end()
            act.client = None
        final: dict[str, Any] = {**usage, "http.response.status_code": record.status,
                                 "sg.upstream.attempts": record.attempts,
                                 "sg.outcome": record.outcome}
        # Set at start; a retry may have moved the request to another destination.
        for name, value in (("sg.destination.id", record.destination),
                            ("sg.destination.region", record.region),
                            ("sg.policy.rule_id", record.policy_rule)):
            if value is not None:
                final[name] = value
        span.set_attributes(final)
        if failed:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR))
        span.end()
        act.span = None

    def attempt_started(
        self, method: str, host: str, port: int, headers: dict[str, str]
    ) -> Span | None:
        """Open the client span of an upstream attempt and add its ``traceparent`` to ``headers``.

        Returns:
            The span (hand it to :meth:`attempt_answered` or :meth:`attempt_failed`), or
            ``None`` outside a traced relay request (health probes pass untouched).
        """
        act = self.active.get()
        if act is None or act.span is None or act.record is None:
            return None
        if act.client is not None:  # a previous attempt still open (should not happen)
            act.client.end()
            act.client = None
        record = act.record
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": operation_name(record.path),
            "gen_ai.provider.name": "vllm",
            "gen_ai.request.model": record.served_model or record.model or "",
            "server.address": host,
            "server.port": port,
            "http.request.method": method,
            "sg.request.id": record.request_id,
            "sg.upstream.attempt": record.attempts,
            **act.params,
        }
        if record.destination is not None:
            attrs["sg.destination.id"] = record.destination
        if record.region is not None:
            attrs["sg.destination.region"] = record.region
        span = self._tracer.start_span(
            f"{attrs['gen_ai.operation.name']} {attrs['gen_ai.request.model']}",
            context=set_span_in_context(act.span),
            kind=SpanKind.CLIENT,
            attributes=attrs,
        )
        self._propagator.inject(headers, context=set_span_in_context(span))
        return span

    def attempt_answered(self, token: object, status: int) -> None:
        """The response head of the attempt arrived with ``status``.

        A 429/502/503 ends the span (the relay retries or gives up); otherwise it ends with
        the response, usage known, in :meth:`end`.
        """
        if not isinstance(token, Span):
            return
        token.set_attribute("http.response.status_code", status)
        if status in _RETRY_STATUSES:
            token.set_attribute("error.type", str(status))
            token.set_status(Status(StatusCode.ERROR))
            token.end()
            return
        act = self.active.get()
        if act is not None:
            act.client = token

    def attempt_failed(self, token: object, exc: BaseException) -> None:
        """The attempt failed before its response head (``error.type`` is the exception's)."""
        if not isinstance(token, Span):
            return
        token.set_attribute("error.type", type(exc).__name__)
        token.set_status(Status(StatusCode.ERROR))
        token.end()

    async def middleware(self, req: aiohttp.ClientRequest, handler: ClientHandlerType) -> Any:
        """aiohttp client middleware: the same client spans for aiohttp sessions.

        Requests outside a traced relay request (health probes) pass untouched.
        """
        carrier: dict[str, str] = {}
        span = self.attempt_started(req.method, req.url.host or "", req.url.port or 0, carrier)
        if span is None:
            return await handler(req)
        for name, value in carrier.items():
            req.headers[name] = value
        try:
            resp = await handler(req)
        except BaseException as exc:
            self.attempt_failed(span, exc)
            raise
        self.attempt_answered(span, resp.status)
        return resp


class MetricsInbox(Protocol):
    """Where the observer hands finished records and audit appends
    (:class:`gateway.telemetry.metrics.GatewayMetrics`; a protocol, so that this module does
    not import the metrics module, which imports :func:`operation_name` from here)."""

    @property
    def finished(self) -> deque[RequestRecord]:
        """Finished request records not yet folded into the instruments."""
        ...

    @property
    def appends(self) -> deque[tuple[str, float, bool]]:
        """``(record type, seconds, ok)`` of audit appends not yet folded."""
        ...

    @property
    def fold_at(self) -> int:
        """Fold when this many wait."""
        ...

    def fold(self) -> None:
        """Record what waits into the instruments."""
        ...


class TelemetryObserver:
    """Telemetry's admission hook and request observer (see the module docstring).

    Args:
        tracer: Creates the request's spans.
        metrics: Receives the finished records and audit appends (``None``: spans only;
            :meth:`gateway.telemetry.Telemetry.bind` sets it).
    """

    def __init__(self, tracer: RequestTracer, metrics: MetricsInbox | None = None) -> None:
        self.tracer = tracer
        self.metrics = metrics

    def on_request(self, record: RequestRecord, headers: Sequence[tuple[bytes, bytes]]) -> None:
        """Start tracing the request, continuing the client's ``traceparent``."""
        carrier = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in headers if name in _TRACE_HEADERS}
        self.tracer.begin(carrier)

    async def admit(self, record: RequestRecord, body: Mapping[str, Any]) -> None:
        """Keep request parameters for the spans (never refuses)."""
        self.tracer.params(body)

    async def on_start(self, record: RequestRecord) -> None:
        """Open the server span before forwarding."""
        self.tracer.start(record)

    async def on_end(self, record: RequestRecord) -> None:
        """Close the spans, hand the record to the metrics, put the trace id on the access line.
        """
        self.tracer.end(record)
        metrics = self.metrics
        if metrics is not None:
            metrics.finished.append(record)
            if len(metrics.finished) >= metrics.fold_at:
                metrics.fold()
        self.tracer.finish()

    def audit_appended(self, type_: str, seconds: float, ok: bool) -> None:
        """Audit append listener (``AuditLog.add_append_listener``): hand the append over."""
        metrics = self.metrics
        if metrics is not None:
            metrics.appends.append((type_, seconds, ok))
            if len(metrics.appends) >= metrics.fold_at:
                metrics.fold()
