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
| ``sg.gateway.policy.denials`` | counter | layer (routing/class/transport), rule |
| ``sg.gateway.replica.inflight`` | gauge | model, replica, destination |
| ``sg.gateway.replica.healthy`` | gauge (0/1) | model, replica, destination |
| ``sg.egress.blocked`` | counter | decision (deny/monitor), destination (process guard) |
| ``sg.audit.append.duration`` | histogram, s | type |
| ``sg.audit.queue.depth`` | gauge | |

Time per output token is derived from the request record (``latency - ttft`` over
``output_tokens - 1``): no work per streamed event.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource

from gateway.records import RequestRecord
from gateway.routing import Router

__all__ = ["GatewayMetrics", "operation_name"]

# Advisory bucket boundaries from the GenAI semantic conventions (seconds / tokens).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5)
DURATION_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                    20.48, 40.96, 81.92)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
AUDIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)

_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "chat",
}
_DENIAL_LAYERS = {
    "egress_denied": "routing",
    "class_change_forbidden": "class",
    "unknown_data_class": "class",
    "upstream_egress_denied": "transport",
    "redirect_refused": "transport",
}


def operation_name(path: str) -> str:
    """``gen_ai.operation.name`` of a relay path (``chat``, ``text_completion``, ...)."""
    return _OPERATIONS.get(path) or path.rsplit("/", 1)[-1]


class GatewayMetrics:
    """The gateway's instruments on their own ``MeterProvider`` (no global provider).

    Args:
        readers: Metric readers (the Prometheus reader, the OTLP periodic reader).
        resource: The ``service.name`` resource.
        router: Replica pools, observed for in-flight and health gauges.
        egress_counts: ``() -> {(decision, destination): count}`` of the process guard.
    """

    def __init__(
        self,
        readers: Sequence[MetricReader],
        resource: Resource,
        router: Router | None = None,
        egress_counts: Callable[[], dict[tuple[str, str], int]] | None = None,
    ) -> None:
        self.provider = MeterProvider(metric_readers=list(readers), resource=resource)
        # The gateway config is the only source of telemetry settings: OTEL_SDK_DISABLED in
        # the environment must not silently empty /metrics.
        self.provider._disabled = False
        m = self.provider.get_meter("sovereign-gateway")
        self._router = router
        self._egress_counts = egress_counts
        self._audit_queue: Callable[[], int] | None = None
        self.requests = m.create_counter("sg.gateway.requests", "{request}",
                                         "Relayed requests by model, key, status and outcome")
        self.duration = m.create_histogram(
            "gen_ai.server.request.duration", "s", "Time in the gateway per request",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.ttft = m.create_histogram(
            "gen_ai.server.time_to_first_token", "s",
            "Time from request start to the first response byte of the backend",
            explicit_bucket_boundaries_advisory=TTFT_BUCKETS)
        self.tpot = m.create_histogram(
            "gen_ai.server.time_per_output_token", "s",
            "Mean inter-token latency of a streamed response after its first token",
            explicit_bucket_boundaries_advisory=TPOT_BUCKETS)
        self.tokens = m.create_histogram(
            "gen_ai.client.token.usage", "{token}", "Input and output tokens per request",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
        self.retries = m.create_counter("sg.gateway.upstream.retries", "{attempt}",
                                        "Upstream attempts beyond the first")
        self.denials = m.create_counter("sg.gateway.policy.denials", "{request}",
                                        "Requests refused by the egress policy")
        self.audit_append = m.create_histogram(
            "sg.audit.append.duration", "s", "Time until an audit record is durable",
            explicit_bucket_boundaries_advisory=AUDIT_BUCKETS)
        self.audit_failures = m.create_counter("sg.audit.append.failures", "{record}",
                                               "Audit appends that failed")
        m.create_observable_gauge("sg.gateway.replica.inflight", [self._inflight], "{request}",
                                  "Requests in flight per replica")
        m.create_observable_gauge("sg.gateway.replica.healthy", [self._healthy], "",
                                  "1 when the replica is available (not ejected, probe ok)")
        m.create_observable_counter("sg.egress.blocked", [self._egress], "{connection}",
                                    "Connections the process egress guard refused")
        m.create_observable_gauge("sg.audit.queue.depth", [self._audit_depth], "{record}",
                                  "Audit records waiting to be committed")

    def watch_audit_queue(self, depth: Callable[[], int]) -> None:
        """Observe the audit writer's queue depth through ``depth()``."""
        self._audit_queue = depth

    def record_audit_append(self, seconds: float, type_: str, ok: bool) -> None:
        """Record one audit append (duration in seconds)."""
        self.audit_append.record(seconds, {"type": type_})
        if not ok:
            self.audit_failures.add(1, {"type": type_})

    def record_request(self, record: RequestRecord) -> None:
        """Record the metrics of one finished relay request."""
        model = record.canonical_model or record.model or ""
        key = record.key_id or ""
        op = operation_name(record.path)
        self.requests.add(1, {"gen_ai.request.model": model, "sg.key.id": key,
                              "http.response.status_code": record.status,
                              "sg.outcome": record.outcome})
        base = {"gen_ai.operation.name": op, "gen_ai.request.model": model, "sg.key.id": key}
        if record.latency_ms is not None:
            attrs = base if record.outcome == "ok" else {
                **base, "error.type": record.error_code or record.outcome}
            self.duration.record(record.latency_ms / 1000.0, attrs)
        if record.error_code in _DENIAL_LAYERS:
            self.denials.add(1, {"sg.layer": _DENIAL_LAYERS[record.error_code],
                                 "sg.policy.rule_id": record.policy_rule or ""})
        if record.attempts > 1:
            self.retries.add(record.attempts - 1, {"gen_ai.request.model": model})
        if record.outcome != "ok":
            return
        if record.ttft_ms is not None:
            self.ttft.record(record.ttft_ms / 1000.0, base)
        if record.input_tokens is not None:
            self.tokens.record(record.input_tokens, {**base, "gen_ai.token.type": "input"})
        out = record.output_tokens
        if out is not None:
            self.tokens.record(out, {**base, "gen_ai.token.type": "output"})
            if (record.stream and out > 1 and record.ttft_ms is not None
                    and record.latency_ms is not None):
                tpot = (record.latency_ms - record.ttft_ms) / 1000.0 / (out - 1)
                self.tpot.record(max(tpot, 0.0), {"gen_ai.operation.name": op,
                                                  "gen_ai.request.model": model})

    def _replicas(self) -> Iterable[Any]:
        if self._router is None:
            return ()
        return (r for pool in self._router.pools.values() for r in pool.replicas)

    def _inflight(self, _: CallbackOptions) -> Iterable[Observation]:
        for r in self._replicas():
            yield Observation(r.outstanding, {"gen_ai.request.model": r.model,
                                              "sg.replica": r.url,
                                              "sg.destination.id": r.destination or ""})

    def _healthy(self, _: CallbackOptions) -> Iterable[Observation]:
        now = time.monotonic()
        for r in self._replicas():
            yield Observation(1 if r.available(now) else 0,
                              {"gen_ai.request.model": r.model, "sg.replica": r.url,
                               "sg.destination.id": r.destination or ""})

    def _egress(self, _: CallbackOptions) -> Iterable[Observation]:
        counts = self._egress_counts() if self._egress_counts is not None else {}
        for (decision, dest), n in counts.items():
            yield Observation(n, {"sg.decision": decision, "sg.destination.id": dest})
        if not counts:
            yield Observation(0, {"sg.decision": "deny", "sg.destination.id": ""})

    def _audit_depth(self, _: CallbackOptions) -> Iterable[Observation]:
        if self._audit_queue is not None:
            yield Observation(self._audit_queue())

    def shutdown(self) -> None:
        """Flush exporters and stop the provider."""
        self.provider.shutdown()
