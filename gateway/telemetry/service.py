"""The telemetry service: providers, exporters, the request observer and the admin server.

:class:`Telemetry` owns its own ``TracerProvider`` (never the global one) and its metric set
(:mod:`gateway.telemetry.aggregate`), so nothing else in the process can add exporters.
Exporters exist only when ``otlp_endpoint`` is configured, and that endpoint must lie inside
the egress-policy destination ``otlp_endpoint_destination`` (``policy.check_binding``). The
OTLP exporters use a ``requests`` session with ``trust_env=False`` and no redirects, so proxy
variables cannot send telemetry elsewhere; the process guard checks their connections too.

Per request, :attr:`Telemetry.observer` (:class:`gateway.telemetry.tracing.TelemetryObserver`)
is an admission hook (reads ``max_tokens`` etc. for span attributes) and an observer
(``on_request`` continues the client's ``traceparent``; server span, metrics, ``trace_id`` on
the access line); this module is not on the request's path. :func:`gateway.assembly.assemble`
registers the observer, puts the tracer's aiohttp client middleware first on the upstream
session (client spans, ``traceparent`` to vLLM) and hands the telemetry the audit log to
measure (:meth:`Telemetry.watch_audit`); the app's lifespan starts and stops the telemetry
itself (admin server, exporters).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import requests
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from prometheus_client import CollectorRegistry

from gateway.config.settings import GatewaySettings
from gateway.routing import Router
from gateway.telemetry.admin import AdminServer
from gateway.telemetry.check import check_endpoint, check_telemetry
from gateway.telemetry.mcp_spans import McpSpans
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import PrometheusCollector
from gateway.telemetry.settings import TelemetrySettings, telemetry_settings
from gateway.telemetry.tracing import RequestTracer, TelemetryObserver

__all__ = ["AuditLogView", "Telemetry", "build_telemetry", "check_telemetry"]

_log = logging.getLogger(__name__)

class AuditLogView(Protocol):
    """What telemetry measures of the audit log (``gateway.audit.AuditLog``)."""

    @property
    def queue_depth(self) -> int:
        """Records waiting to be committed."""
        ...

    def add_append_listener(self, listener: Callable[[str, float, bool], None]) -> None:
        """Call ``listener(type, seconds, ok)`` after each append."""
        ...


def _session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # no HTTP(S)_PROXY / NO_PROXY / .netrc
    session.max_redirects = 0  # a redirect is an error, never followed
    return session


class Telemetry:
    """Traces and metrics of one gateway process.

    Args:
        settings: The validated ``telemetry:`` section.
        policy: The egress policy (required when ``otlp_endpoint`` is set).
        span_exporter: Extra span exporter (tests: an in-memory exporter, synchronous).
        egress_counts: Process guard event counts (``EgressEvents.counts`` snapshot).

    Attributes:
        observer: The per-request admission hook and observer (spans, metrics hand-over).
        tracer: Creates the spans; ``tracer.middleware`` is the upstream client middleware.
        mcp_spans: The spans of MCP requests (handed to the MCP endpoint).
        metrics: The metric set, once :meth:`bind` ran.

    Raises:
        ConfigError: The OTLP endpoint is not inside its policy destination.
    """

    def __init__(
        self,
        settings: TelemetrySettings,
        *,
        policy: Any = None,
        span_exporter: SpanExporter | None = None,
        egress_counts: Callable[[], dict[tuple[str, str], int]] | None = None,
    ) -> None:
        check_endpoint(settings, policy)
        self.settings = settings
        self._egress_counts = egress_counts
        resource = Resource({"service.name": settings.service_name})
        self.tracer_provider = TracerProvider(
            resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio))
        )
        # The standard OTEL_SDK_DISABLED=true is honoured by the SDK (spans become no-ops): it
        # can only turn telemetry off, never send anything anywhere.
        self._resource = resource
        self.registry = CollectorRegistry(auto_describe=False)
        self._pusher: _MetricPusher | None = None
        processors: list[SpanProcessor] = []
        if span_exporter is not None:
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor

            processors.append(SimpleSpanProcessor(span_exporter))
        if settings.otlp_endpoint is not None:
            from opentelemetry.exporter.otlp.proto.http import Compression
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            common: dict[str, Any] = {
                "headers": dict(settings.otlp_headers),
                "timeout": settings.otlp_timeout_s,
                "compression": Compression.NoCompression,
            }
            processors.append(BatchSpanProcessor(OTLPSpanExporter(
                endpoint=settings.otlp_endpoint + "/v1/traces", session=_session(), **common)))
            self._pusher = _MetricPusher(
                OTLPMetricExporter(endpoint=settings.otlp_endpoint + "/v1/metrics",
                                   session=_session(), **common),
                self, settings.export_interval_s,
            )
        for proc in processors:
            self.tracer_provider.add_span_processor(proc)
        self.metrics: GatewayMetrics | None = None
        self._stopped = False
        self.tracer = RequestTracer(
            self.tracer_provider.get_tracer("sovereign-gateway")  # type: ignore[arg-type]
        )
        self.observer = TelemetryObserver(self.tracer)
        self.mcp_spans = McpSpans(self.tracer_provider.get_tracer("sovereign-gateway"))
        self.admin = AdminServer(settings.admin.host, settings.admin.port, self.registry)

    def bind(self, router: Router) -> None:
        """Create the metrics (observing ``router``); called by the assembly at start, and at
        each live reload with the new router (the metrics and registry are kept)."""
        if self.metrics is None:
            self.metrics = GatewayMetrics(self._resource, router, self._egress_counts)
            self.registry.register(PrometheusCollector(self.metrics.set))
            self.observer.metrics = self.metrics
            self.mcp_spans.metrics = self.metrics
        else:
            self.metrics.rebind(router)

    # --- lifespan ---------------------------------------------------------------------

    async def startup(self) -> None:
        """Start the admin server (``/metrics``) and the OTLP metric pusher."""
        await self.admin.start()
        if self._pusher is not None:
            self._pusher.start()

    async def shutdown(self) -> None:
        """Stop the admin server, flush and stop the exporters (idempotent)."""
        await self.admin.stop()
        if self._stopped:
            return
        self._stopped = True
        self.tracer_provider.shutdown()
        if self._pusher is not None:
            self._pusher.stop()

    def watch_audit(self, log: AuditLogView) -> None:
        """Measure the audit log's appends and queue depth through its listener API."""
        metrics = self.metrics
        if metrics is None:
            return
        log.add_append_listener(self.observer.audit_appended)
        metrics.watch_audit_queue(lambda: log.queue_depth)


    def watch_flow(self, lengths: Callable[[], list[tuple[str, str, int]]],
                   reserve: Callable[[], list[tuple[str, int, int]]] | None = None) -> None:
        """Observe the flow-control queue lengths (``(model, class, waiters)`` rows) and its
        reserve (``(model, widened 0/1, demand)`` rows)."""
        if self.metrics is not None:
            self.metrics.watch_flow(lengths, reserve)


    def watch_jwks(self, outcomes: Callable[[], Iterable[tuple[tuple[str, ...], float]]]) -> None:
        """Observe the ``jwks_uri`` fetches (``((issuer, outcome), count)`` rows,
        :meth:`gateway.identity.fetch.JwksFetcher.outcome_rows`)."""
        if self.metrics is not None:
            self.metrics.watch_jwks(outcomes)

    def watch_mcp(self, calls: Callable[[], Iterable[tuple[tuple[str, ...], float]]],
                  seconds: Callable[[], Iterable[tuple[tuple[str, ...], float]]],
                  queued: Callable[[], Iterable[tuple[tuple[str, ...], float]]] | None = None,
                  ) -> None:
        """Observe the MCP endpoint's call counters and flow-gate queues
        (:mod:`gateway.mcp.metrics`)."""
        if self.metrics is not None:
            self.metrics.watch_mcp(calls, seconds, queued)


class _MetricPusher:
    """Pushes the metric set to the OTLP exporter every ``interval_s`` seconds (a thread)."""

    def __init__(self, exporter: Any, telemetry: Telemetry, interval_s: float) -> None:
        self._exporter = exporter
        self._telemetry = telemetry
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sg-otlp-metrics",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._export()

    def _export(self) -> None:
        metrics = self._telemetry.metrics
        if metrics is None:
            return
        try:
            self._exporter.export(metrics.set.otlp(),
                                  timeout_millis=self._telemetry.settings.otlp_timeout_s * 1000)
        except Exception:
            _log.exception("OTLP metric export failed")

    def stop(self) -> None:
        """Stop the thread, push once more, shut the exporter down."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._telemetry.settings.otlp_timeout_s + 1)
            self._thread = None
        self._export()
        self._exporter.shutdown()


def build_telemetry(
    settings: GatewaySettings, policy: Any = None, egress: Any = None
) -> Telemetry | None:
    """The telemetry of ``settings.telemetry`` (``None`` when absent or disabled).

    Args:
        settings: Gateway settings.
        policy: The egress policy (``EgressRuntime.policy``), for the OTLP destination check.
        egress: ``EgressEvents`` of the process guard (counts become ``sg.egress.blocked``).

    Raises:
        ConfigError: Invalid section or collector outside its destination.
    """
    ts = telemetry_settings(settings.telemetry)
    if ts is None:
        return None
    counts = egress.snapshot if egress is not None else None
    return Telemetry(ts, policy=policy, egress_counts=counts)
