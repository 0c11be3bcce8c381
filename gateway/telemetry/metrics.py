"""Gateway metrics: OpenTelemetry instruments, exported to Prometheus and (optionally) OTLP.

GenAI semantic-convention names where they exist
(https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-metrics/), ``sg.*`` otherwise:

| instrument | kind, unit | attributes |
| --- | --- | --- |
| ``sg.gateway.requests`` | counter | model, key, status, outcome |
| ``gen_ai.server.request.duration`` | histogram, s | operation, model, key, error.type |
| ``gen_ai.server.time_to_first_token`` | histogram, s | operation, model, key |
| ``gen_ai.server.time_per_output_token`` | histogram, s | operation, model (streams; the
  per-request mean inter-token latency, as the semconv defines it) |
| ``gen_ai.client.token.usage`` | histogram, {token} | token type, model, key |
| ``sg.gateway.upstream.retries`` | counter | model |
| ``sg.gateway.policy.denials`` | counter | layer (routing/class/transport/pii), rule |
| ``sg.gateway.replica.inflight`` | gauge | model, replica, destination |
| ``sg.gateway.replica.healthy`` | gauge (0/1) | model, replica, destination |
| ``sg.egress.blocked`` | counter | decision (deny/monitor), destination (process guard) |
| ``sg.audit.append.duration`` | histogram, s | type |
| ``sg.audit.queue.depth`` | gauge | |
| ``sg.gateway.routing.decisions`` | counter | model, reason (prefix/load/imbalance/session) |
| ``sg.gateway.routing.matched_blocks``, ``.prompt_blocks`` | counter, {block} | model |
| ``sg.gateway.replica.waiting``/``running``/``kv_usage``/``signals_age``/``index_blocks``/
  ``prefill_tokens``/``cache_exact``/``exact_blocks`` |
  gauge | model, replica, destination (``prefix_affinity`` pools; see gateway.fleet) |
| ``sg.gateway.flow.requests`` | counter | model, class, outcome (immediate/dispatched/
  queue_full/queue_timeout/client_disconnect; see gateway.flow) |
| ``sg.gateway.flow.wait`` | histogram, s | model, class (requests that queued) |
| ``sg.gateway.flow.queue_length`` | gauge | model, class |
| ``sg.gateway.pii.findings`` | counter, {finding} | entity type, action (raise/mask/refuse/
  record; ``response`` for findings in a model's answer; see gateway.pii.request) |
| ``sg.gateway.pii.requests`` | counter | class before, class after, outcome (clean/found/
  refused/scan_failed) |
| ``sg.gateway.mcp.calls`` | counter | MCP server, tool or method, decision, reason |
| ``sg.gateway.mcp.tool_call.time`` | counter (s) | MCP server |
| ``sg.gateway.mcp.queued`` | gauge | MCP server (calls waiting behind its ``flow`` gate;
  servers with a ``flow`` section only) |
| ``sg.gateway.mcp.tool_call.duration`` | histogram, s | MCP server, tool (forwarded tool
  calls, arrival to end of the answer; recorded by :mod:`gateway.telemetry.mcp_spans`) |

Time per output token is derived from the request record (``latency - ttft`` over
``output_tokens - 1``): no work per streamed event. Values are aggregated in process
(:mod:`gateway.telemetry.aggregate`, ~1 us per record) and exported from the same state to
Prometheus and OTLP.

A relayed request does not record its metrics itself: the telemetry observer
(:class:`gateway.telemetry.tracing.TelemetryObserver`) hands the finished request record and
each audit append over (:attr:`GatewayMetrics.finished`, :attr:`GatewayMetrics.appends`, two
deques) and they are folded into the instruments when the metrics are read (``/metrics``, the
OTLP push: :meth:`MetricSet.snapshots` runs :meth:`GatewayMetrics.fold` first) or when
:data:`FOLD_AT` are waiting, so the request path does a deque append instead of the ~7
instrument updates.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.sdk.resources import Resource

from gateway.bounded import OTHER
from gateway.fleet.replica_metrics import SIGNAL_FIELDS, signal_rows
from gateway.relay.records import RequestRecord
from gateway.routing import Router
from gateway.telemetry.aggregate import Labels, MetricSet
from gateway.telemetry.tracing import operation_name

__all__ = ["GatewayMetrics", "operation_name"]

# Advisory bucket boundaries from the GenAI semantic conventions (seconds / tokens).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5)
DURATION_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                    20.48, 40.96, 81.92)
MCP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
               30.0, 60.0, 300.0)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                120.0, 300.0)
FOLD_AT = 64
"""Hand-overs waiting at most before the observer folds them itself: small, so the records
waiting are few and short-lived (per-request objects should die by reference counting, not
reach the cyclic collector: :mod:`gateway.serving.runtime_tuning`), and still one fold per 64
requests
(about 0.5 ms)."""

AUDIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)

_DENIAL_LAYERS = {
    "egress_denied": "routing",
    "class_change_forbidden": "class",
    "unknown_data_class": "class",
    "upstream_egress_denied": "transport",
    "redirect_refused": "transport",
    "pii_refused": "pii",
}


_NOT_QUEUED = frozenset({"immediate", "queue_full"})  # flow outcomes without a wait
_MODEL = "gen_ai.request.model"
_KEY = "sg.key.id"
_OP = "gen_ai.operation.name"
_REPLICA_LABELS = (_MODEL, "sg.replica", "sg.destination.id")


class GatewayMetrics:
    """The gateway's instruments (see the module docstring), aggregated in process.

    Args:
        resource: The ``service.name`` resource.
        router: Replica pools, observed for in-flight and health gauges.
        egress_counts: ``() -> {(decision, destination): count}`` of the process guard.

    Attributes:
        finished: Finished request records handed over by the telemetry observer, not yet
            recorded (:meth:`fold` records them).
        appends: ``(record type, seconds, ok)`` of audit appends, not yet recorded.
        fold_at: The observer folds itself when this many wait (:data:`FOLD_AT`).
    """

    def __init__(
        self,
        resource: Resource,
        router: Router | None = None,
        egress_counts: Callable[[], dict[tuple[str, str], int]] | None = None,
    ) -> None:
        self.set = MetricSet(resource)
        m = self.set
        self.finished: deque[RequestRecord] = deque()
        self.appends: deque[tuple[str, float, bool]] = deque()
        self.fold_at = FOLD_AT
        m.before_snapshot(self.fold)
        self._router = router
        self._egress_counts = egress_counts
        self._audit_queue: Callable[[], int] | None = None
        self._flow_queues: Callable[[], list[tuple[str, str, int]]] | None = None
        self._flow_reserve: Callable[[], list[tuple[str, int, int]]] | None = None
        self._mcp: Callable[[], Iterable[tuple[tuple[str, ...], float]]] | None = None
        self._mcp_seconds: Callable[[], Iterable[tuple[tuple[str, ...], float]]] | None = None
        self._mcp_queued: Callable[[], Iterable[tuple[tuple[str, ...], float]]] | None = None
        self._jwks: Callable[[], Iterable[tuple[tuple[str, ...], float]]] | None = None
        self.requests = m.counter(
            "sg.gateway.requests", "{request}",
            "Relayed requests by model, key, status and outcome",
            (_MODEL, _KEY, "http.response.status_code", "sg.outcome"))
        self.duration = m.histogram(
            "gen_ai.server.request.duration", "s", "Time in the gateway per request",
            (_OP, _MODEL, _KEY, "error.type"), DURATION_BUCKETS)
        self.ttft = m.histogram(
            "gen_ai.server.time_to_first_token", "s",
            "Time from request start to the first response byte of the backend",
            (_OP, _MODEL, _KEY), TTFT_BUCKETS)
        self.tpot = m.histogram(
            "gen_ai.server.time_per_output_token", "s",
            "Mean inter-token latency of a streamed response after its first token",
            (_OP, _MODEL), TPOT_BUCKETS)
        self.tokens = m.histogram(
            "gen_ai.client.token.usage", "{token}", "Input and output tokens per request",
            (_OP, _MODEL, _KEY, "gen_ai.token.type"), TOKEN_BUCKETS)
        self.retries = m.counter("sg.gateway.upstream.retries", "{attempt}",
                                 "Upstream attempts beyond the first", (_MODEL,))
        self.denials = m.counter("sg.gateway.policy.denials", "{request}",
                                 "Requests refused by the egress policy",
                                 ("sg.layer", "sg.policy.rule_id"))
        self.audit_append = m.histogram(
            "sg.audit.append.duration", "s", "Time until an audit record is durable",
            ("type",), AUDIT_BUCKETS)
        self.audit_failures = m.counter("sg.audit.append.failures", "{record}",
                                        "Audit appends that failed", ("type",))
        m.observed("sg.gateway.replica.inflight", "{request}", "Requests in flight per replica",
                   _REPLICA_LABELS, self._inflight)
        m.observed("sg.gateway.replica.healthy", "",
                   "1 when the replica is available (not ejected, probe ok)",
                   _REPLICA_LABELS, self._healthy)
        m.observed("sg.egress.blocked", "{connection}",
                   "Connections the process egress guard refused",
                   ("sg.decision", "sg.destination.id"), self._egress, kind="counter")
        m.observed("sg.audit.queue.depth", "{record}", "Audit records waiting to be committed",
                   (), self._audit_depth)
        self.route_decisions = m.counter(
            "sg.gateway.routing.decisions", "{request}",
            "Fleet-aware routing decisions by reason", (_MODEL, "sg.routing.reason"))
        self.route_matched = m.counter(
            "sg.gateway.routing.matched_blocks", "{block}",
            "Prompt blocks found in the chosen replica's prefix index", (_MODEL,))
        self.route_blocks = m.counter(
            "sg.gateway.routing.prompt_blocks", "{block}",
            "Prompt blocks of routed requests", (_MODEL,))
        self.pii_findings = m.counter(
            "sg.gateway.pii.findings", "{finding}",
            "Sensitive data found in requests, by entity type and the policy's action",
            ("sg.pii.entity", "sg.pii.action"))
        self.pii_requests = m.counter(
            "sg.gateway.pii.requests", "{request}",
            "Requests scanned for sensitive data, by class before and after and outcome",
            ("sg.pii.class_before", "sg.pii.class_after", "sg.pii.outcome"))
        self.flow_requests = m.counter(
            "sg.gateway.flow.requests", "{request}",
            "Flow-controlled requests by class and how they left the gateway's queue",
            (_MODEL, "sg.flow.class", "sg.flow.outcome"))
        self.flow_wait = m.histogram(
            "sg.gateway.flow.wait", "s", "Time queued requests waited in the gateway",
            (_MODEL, "sg.flow.class"), WAIT_BUCKETS)
        m.observed("sg.gateway.flow.queue_length", "{request}",
                   "Requests waiting in the gateway's flow-control queue",
                   (_MODEL, "sg.flow.class"), self._flow_lengths)
        m.observed("sg.gateway.flow.reserve.widened", "{state}",
                   "1 while the model's flow-control reserve is widened (every replica serves "
                   "every class), 0 while its reserved replicas are kept free of the lower "
                   "classes", (_MODEL,), self._reserve_field(1))
        m.observed("sg.gateway.flow.reserve.demand", "{request}",
                   "Requests of the reserve's classes in flight at its last decision",
                   (_MODEL,), self._reserve_field(2))
        for field, unit, text in SIGNAL_FIELDS:
            m.observed(f"sg.gateway.replica.{field}", unit, text, _REPLICA_LABELS,
                       self._signal(field))
        m.observed("sg.gateway.mcp.calls", "{request}",
                   "MCP requests by server, tool (or method), decision and refusal reason",
                   ("sg.mcp.server", "sg.mcp.tool", "sg.decision", "sg.mcp.reason"),
                   lambda: self._mcp() if self._mcp is not None else [], kind="counter")
        m.observed("sg.gateway.mcp.tool_call.time", "s",
                   "Total time of forwarded MCP tool calls by server",
                   ("sg.mcp.server",),
                   lambda: self._mcp_seconds() if self._mcp_seconds is not None else [],
                   kind="counter")
        m.observed("sg.gateway.mcp.queued", "{request}",
                   "MCP calls waiting for a slot behind their server's flow gate",
                   ("sg.mcp.server",),
                   lambda: self._mcp_queued() if self._mcp_queued is not None else [])
        m.observed("sg.gateway.identity.jwks_fetches", "{fetch}",
                   "jwks_uri fetches by issuer and outcome (ok, refused: the keys in use "
                   "stayed, error: a bug caught by the refresh loop)",
                   ("sg.identity.issuer", "sg.outcome"),
                   lambda: self._jwks() if self._jwks is not None else [], kind="counter")
        self.mcp_duration = m.histogram(
            "sg.gateway.mcp.tool_call.duration", "s",
            "Time of forwarded MCP tool calls in the gateway, arrival to the end of the answer",
            ("sg.mcp.server", "sg.mcp.tool"), MCP_BUCKETS)

    def rebind(self, router: Router) -> None:
        """Observe the pools of ``router`` from the next collection on (live reload)."""
        self._router = router

    def watch_audit_queue(self, depth: Callable[[], int]) -> None:
        """Observe the audit writer's queue depth through ``depth()``."""
        self._audit_queue = depth

    def watch_flow(self, lengths: Callable[[], list[tuple[str, str, int]]],
                   reserve: Callable[[], list[tuple[str, int, int]]] | None = None) -> None:
        """Observe the flow-control queues through ``lengths()`` (``(model, class, n)`` rows)
        and the reserve through ``reserve()`` (``(model, widened 0/1, demand)`` rows)."""
        self._flow_queues = lengths
        self._flow_reserve = reserve

    def _reserve_field(self, i: int) -> Callable[[], Iterable[tuple[Labels, float]]]:
        def rows() -> Iterable[tuple[Labels, float]]:
            if self._flow_reserve is None:
                return []
            return [((row[0],), float(row[i])) for row in self._flow_reserve()]
        return rows

    def watch_jwks(self, outcomes: Callable[[], Iterable[tuple[tuple[str, ...], float]]]) -> None:
        """Observe the ``jwks_uri`` fetch outcomes (``((issuer, outcome), count)`` rows)."""
        self._jwks = outcomes

    def watch_mcp(self, calls: Callable[[], Iterable[tuple[tuple[str, ...], float]]],
                  seconds: Callable[[], Iterable[tuple[tuple[str, ...], float]]],
                  queued: Callable[[], Iterable[tuple[tuple[str, ...], float]]] | None = None,
                  ) -> None:
        """Observe the MCP endpoint's counters (``gateway.mcp.metrics.McpMetrics``) and, with
        ``queued``, its flow gates (``gateway.mcp.metrics.queued_rows``)."""
        self._mcp, self._mcp_seconds, self._mcp_queued = calls, seconds, queued

    def _flow_lengths(self) -> Iterable[tuple[Labels, float]]:
        if self._flow_queues is None:
            return []
        return [((model, cls), float(n)) for model, cls, n in self._flow_queues()]

    def fold(self) -> None:
        """Record the finished requests and audit appends handed over since the last fold.

        Safe from any thread (``deque.popleft`` is atomic; the instruments lock).
        """
        finished, appends = self.finished, self.appends
        while finished:
            try:
                record = finished.popleft()
            except IndexError:  # another thread folded the last one
                break
            self.record_request(record)
        while appends:
            try:
                type_, seconds, ok = appends.popleft()
            except IndexError:
                break
            self.record_audit_append(seconds, type_, ok)

    def record_audit_append(self, seconds: float, type_: str, ok: bool) -> None:
        """Record one audit append (duration in seconds)."""
        self.audit_append.record(seconds, (type_,))
        if not ok:
            self.audit_failures.add(1, (type_,))

    def _record_pii(self, pii: dict[str, Any]) -> None:
        actions = pii["actions"]
        for entity, n in pii["entities"].items():
            self.pii_findings.add(n, (entity, actions.get(entity, "")))
        for entity, n in (pii.get("response_entities") or {}).items():
            self.pii_findings.add(n, (entity, "response"))
        outcome = ("scan_failed" if pii["error"] else
                   "refused" if "refuse" in actions.values() else
                   "found" if pii["entities"] else "clean")
        self.pii_requests.add(1, (pii["class_before"], pii["class_after"], outcome))

    def model_label(self, record: RequestRecord) -> str:
        """The ``gen_ai.request.model`` label of ``record``: a configured model name only.

        The configured name the request resolved to; for a request refused before routing,
        the configured model its ``model`` names (name, alias or served name), ``""``
        without one, and :data:`gateway.bounded.OTHER` for a name that is not configured,
        so clients cannot add series (one per distinct name) to every model instrument.
        """
        if record.canonical_model is not None:
            return record.canonical_model
        if not record.model:
            return ""
        pool = self._router.resolve(record.model) if self._router is not None else None
        return pool.model.name if pool is not None else OTHER

    def record_request(self, record: RequestRecord) -> None:
        """Record the metrics of one finished relay request."""
        model = self.model_label(record)
        key = record.key_id or ""
        op = operation_name(record.path)
        ok = record.outcome == "ok"
        self.requests.add(1, (model, key, record.status, record.outcome))
        if record.latency_ms is not None:
            error = "" if ok else (record.error_code or record.outcome)
            self.duration.record(record.latency_ms / 1000.0, (op, model, key, error))
        if record.error_code in _DENIAL_LAYERS:
            self.denials.add(1, (_DENIAL_LAYERS[record.error_code], record.policy_rule or ""))
        if record.attempts > 1:
            self.retries.add(record.attempts - 1, (model,))
        if record.route is not None:
            self.route_decisions.add(1, (model, record.route.get("reason", "")))
            self.route_matched.add(record.route.get("matched_blocks", 0), (model,))
            self.route_blocks.add(record.route.get("prompt_blocks", 0), (model,))
        pii = record.pii
        if pii is not None:
            self._record_pii(pii)
        flow = record.flow
        if flow is not None:
            self.flow_requests.add(1, (model, flow["class"], flow["outcome"]))
            if flow["outcome"] not in _NOT_QUEUED:
                self.flow_wait.record(flow["wait_ms"] / 1000.0, (model, flow["class"]))
        if not ok:
            return
        if record.ttft_ms is not None:
            self.ttft.record(record.ttft_ms / 1000.0, (op, model, key))
        if record.input_tokens is not None:
            self.tokens.record(record.input_tokens, (op, model, key, "input"))
        out = record.output_tokens
        if out is not None:
            self.tokens.record(out, (op, model, key, "output"))
            if (record.stream and out > 1 and record.ttft_ms is not None
                    and record.latency_ms is not None):
                tpot = (record.latency_ms - record.ttft_ms) / 1000.0 / (out - 1)
                self.tpot.record(max(tpot, 0.0), (op, model))

    def _replicas(self) -> Iterable[Any]:
        if self._router is None:
            return ()
        return (r for pool in self._router.pools.values() for r in pool.replicas)

    def _inflight(self) -> Iterable[tuple[Labels, float]]:
        for r in self._replicas():
            yield (r.model, r.url, r.destination or ""), r.outstanding

    def _healthy(self) -> Iterable[tuple[Labels, float]]:
        now = time.monotonic()
        for r in self._replicas():
            yield (r.model, r.url, r.destination or ""), 1 if r.available(now) else 0

    def _signal(self, field: str) -> Callable[[], Iterable[tuple[Labels, float]]]:
        def observe() -> Iterable[tuple[Labels, float]]:
            if self._router is None:
                return
            for r, row in signal_rows(self._router, time.monotonic()):
                value = row[field]
                if value is not None:
                    yield (r.model, r.url, r.destination or ""), value
        return observe

    def _egress(self) -> Iterable[tuple[Labels, float]]:
        counts = self._egress_counts() if self._egress_counts is not None else {}
        yield from counts.items()
        if not counts:
            yield ("deny", ""), 0

    def _audit_depth(self) -> Iterable[tuple[Labels, float]]:
        if self._audit_queue is not None:
            yield (), self._audit_queue()
