"""The telemetry service: providers, exporters, the request observer and the admin server.

:class:`Telemetry` owns its own ``TracerProvider`` (never the global one) and its metric set
(:mod:`gateway.telemetry.aggregate`), so nothing else in the process can add exporters.
Exporters exist only when ``otlp_endpoint`` is configured, and that endpoint must lie inside
the egress-policy destination ``otlp_endpoint_destination`` (``policy.check_binding``). The
OTLP exporters use a ``requests`` session with ``trust_env=False`` and no redirects, so proxy
variables cannot send telemetry elsewhere; the process guard checks their connections too.

Per request it is an admission hook (reads ``max_tokens`` etc. for span attributes) and an
observer (server span, metrics, ``trace_id`` on the access line); :func:`with_telemetry` also
adds its aiohttp client middleware (client spans, ``traceparent`` to vLLM) and an ASGI wrapper
that continues the client's ``traceparent``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import requests
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from prometheus_client import CollectorRegistry

from gateway.errors import ConfigError
from gateway.records import RequestRecord
from gateway.relay import RELAY_PATHS
from gateway.routing import Router
from gateway.settings import GatewaySettings
from gateway.telemetry.admin import AdminServer
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import PrometheusCollector
from gateway.telemetry.settings import TelemetrySettings, telemetry_settings
from gateway.telemetry.tracing import RequestTracer

__all__ = ["Telemetry", "build_telemetry", "check_telemetry", "with_telemetry"]

_log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
_TRACE_HEADERS = (b"traceparent", b"tracestate")


def _session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # no HTTP(S)_PROXY / NO_PROXY / .netrc
    session.max_redirects = 0  # a redirect is an error, never followed
    return session


def _check_endpoint(ts: TelemetrySettings, policy: Any) -> None:
    if ts.otlp_endpoint is None:
        return
    from policy import PolicyError, check_binding

    if policy is None:
        raise ConfigError(
            "telemetry.otlp_endpoint: an OTLP collector needs the egress policy (policy.file) "
            "naming it as a destination"
        )
    try:
        check_binding(policy, ts.otlp_endpoint, ts.otlp_endpoint_destination or "")
    except PolicyError as exc:
        raise ConfigError(f"telemetry.otlp_endpoint_destination: {exc.message}") from exc


class Telemetry:
    """Traces and metrics of one gateway process.

    Args:
        settings: The validated ``telemetry:`` section.
        policy: The egress policy (required when ``otlp_endpoint`` is set).
        span_exporter: Extra span exporter (tests: an in-memory exporter, synchronous).
        egress_counts: Process guard event counts (``EgressEvents.counts`` snapshot).

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
        _check_endpoint(settings, policy)
        self.settings = settings
        self._egress_counts = egress_counts
        resource = Resource({"service.name": settings.service_name})
        self.tracer_provider = TracerProvider(
            resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio))
        )
        self.tracer_provider._disabled = False  # config file, not OTEL_* env
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
        self.admin = AdminServer(settings.admin.host, settings.admin.port, self.registry)

    def bind(self, router: Router) -> None:
        """Create the metrics (observing ``router``); called once by :func:`with_telemetry`."""
        if self.metrics is None:
            self.metrics = GatewayMetrics(self._resource, router, self._egress_counts)
            self.registry.register(PrometheusCollector(self.metrics.set))

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

    # --- admission hook and observer ---------------------------------------------------

    async def admit(self, record: RequestRecord, body: Mapping[str, Any]) -> None:
        """Keep request parameters for the spans (never refuses)."""
        self.tracer.params(body)

    async def on_start(self, record: RequestRecord) -> None:
        """Open the server span before forwarding."""
        self.tracer.start(record)

    async def on_end(self, record: RequestRecord) -> None:
        """Close the spans, record the metrics, put the trace id on the access line."""
        self.tracer.end(record)
        if self.metrics is not None:
            self.metrics.record_request(record)

    # --- wrappers ----------------------------------------------------------------------

    def asgi(self, app: ASGIApp) -> ASGIApp:
        """Wrap ``app``: continue the client's ``traceparent`` on relay paths."""
        tracer = self.tracer

        async def traced(scope: Scope, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or scope["path"] not in RELAY_PATHS:
                await app(scope, receive, send)
                return
            carrier = {name.decode("latin-1"): value.decode("latin-1")
                       for name, value in scope["headers"] if name in _TRACE_HEADERS}
            token = tracer.begin(carrier)
            try:
                await app(scope, receive, send)
            finally:
                tracer.reset(token)

        return traced

    def time_audit(self, observer: Any) -> None:
        """Measure the audit log's appends and queue (the observer's ``log``)."""
        from gateway.audit.observer import AuditObserver

        metrics = self.metrics
        if not isinstance(observer, AuditObserver) or metrics is None:
            return
        log = observer.log
        append = log.append

        async def timed_append(event: Mapping[str, Any]) -> Any:
            t0 = time.perf_counter()
            ok = False
            try:
                result = await append(event)
                ok = True
                return result
            finally:
                metrics.record_audit_append(time.perf_counter() - t0,
                                            str(event.get("type", "")), ok)

        log.append = timed_append  # type: ignore[method-assign]
        pending = getattr(log, "_pending", None)
        if pending is not None:
            metrics.watch_audit_queue(lambda: len(pending))


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


def check_telemetry(settings: GatewaySettings, policy: Any = None) -> TelemetrySettings | None:
    """Validate the ``telemetry:`` section without starting anything (``gateway check-config``).

    Raises:
        ConfigError: Invalid section or collector outside its policy destination.
    """
    ts = telemetry_settings(settings.telemetry)
    if ts is not None:
        _check_endpoint(ts, policy)
    return ts


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


def with_telemetry(telemetry: Telemetry, factory: Callable[..., Any]) -> Callable[..., Any]:
    """Return ``factory`` with telemetry wired in (outermost middleware, first hook).

    The returned factory builds the router itself (so metrics can observe replicas), adds the
    telemetry as admission hook and observer, its client middleware first in
    ``upstream_middlewares``, and wraps the app to continue client trace context.
    """

    def build(settings: GatewaySettings, **kwargs: Any) -> Any:
        router = kwargs.get("router") or Router(settings)
        kwargs["router"] = router
        telemetry.bind(router)
        observers = list(kwargs.pop("observers", ()))
        for observer in observers:
            telemetry.time_audit(observer)
        kwargs["observers"] = [*observers, telemetry]
        kwargs["admission"] = [telemetry, *kwargs.pop("admission", ())]
        kwargs["upstream_middlewares"] = (
            telemetry.tracer.middleware, *kwargs.get("upstream_middlewares", ())
        )
        app = factory(settings, **kwargs)
        return telemetry.asgi(app)

    return build
