"""An OTLP/HTTP receiver for the tests: the ``oteltest`` package's ``HttpSink`` (a standalone
OTLP/HTTP server decoding ``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest`` /
``ExportLogsServiceRequest`` with the OpenTelemetry protobufs) on a free port, and a handler that
keeps what arrived, decoded.

Note: ``HttpSink`` binds every interface (``""``) on the port it is given; the tests give it a
free port and only ever send to ``127.0.0.1``.

OTLP/HTTP: https://opentelemetry.io/docs/specs/otlp/#otlphttp
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from oteltest.sink import HttpSink
from oteltest.sink.handler import RequestHandler

from tests.conftest import free_port

_log = logging.getLogger(__name__)


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


def attributes(kvs: Any) -> dict[str, Any]:
    """OTLP ``repeated KeyValue`` -> ``{key: python value}`` (string/bool/int/double)."""
    out: dict[str, Any] = {}
    kv: KeyValue
    for kv in kvs:
        out[kv.key] = _value(kv.value)
    return out


class _Keep(RequestHandler):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.logs: list[ExportLogsServiceRequest] = []
        self.headers: list[dict[str, str]] = []

    def handle_trace(self, request: ExportTraceServiceRequest, headers: Any) -> None:
        with self.lock:
            self.traces.append(request)
            self.headers.append(dict(headers))

    def handle_metrics(self, request: ExportMetricsServiceRequest, headers: Any) -> None:
        with self.lock:
            self.metrics.append(request)
            self.headers.append(dict(headers))

    def handle_logs(self, request: ExportLogsServiceRequest, headers: Any) -> None:
        with self.lock:
            self.logs.append(request)
            self.headers.append(dict(headers))


class OtlpSink:
    """``oteltest``'s OTLP/HTTP sink on a free port; :attr:`url` is the OTLP base URL."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._got = _Keep()
        self._sink = HttpSink(self._got, _log, port=self.port)
        self._connections = 0

    def start(self, timeout_s: float = 10.0) -> OtlpSink:
        """Start serving and wait (bounded) until the port accepts connections.

        Raises:
            TimeoutError: Not listening within ``timeout_s``.
        """
        self._sink.start()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"OTLP sink not listening on {self.port}") from None
                time.sleep(0.02)
        # Count accepted connections (socketserver calls verify_request for each one), so a
        # test can tell "nothing connected" from "nothing decodable arrived".
        httpd = self._sink.httpd
        assert httpd is not None
        accept = httpd.verify_request

        def counted(request: Any, client_address: Any) -> bool:
            with self._got.lock:
                self._connections += 1
            return bool(accept(request, client_address))

        httpd.verify_request = counted  # type: ignore[method-assign]
        with self._got.lock:
            self._connections = 0  # the readiness probe above is not counted
        return self

    def connections(self) -> int:
        """TCP connections accepted since :meth:`start` (the readiness probe not counted)."""
        with self._got.lock:
            return self._connections

    def stop(self) -> None:
        """Shut the server down and join its thread."""
        self._sink.stop()

    def clear(self) -> None:
        """Forget what arrived so far."""
        with self._got.lock:
            self._got.traces.clear()
            self._got.metrics.clear()
            self._got.logs.clear()
            self._got.headers.clear()
            self._connections = 0

    def requests(self) -> int:
        """Number of OTLP export requests received (traces + metrics + logs)."""
        with self._got.lock:
            return len(self._got.traces) + len(self._got.metrics) + len(self._got.logs)

    def spans(self) -> list[Any]:
        """Every received span (``opentelemetry.proto.trace.v1.Span``)."""
        with self._got.lock:
            return [s for req in self._got.traces for rs in req.resource_spans
                    for ss in rs.scope_spans for s in ss.spans]

    def resources(self) -> list[dict[str, Any]]:
        """The resource attributes of every received span and metric batch."""
        with self._got.lock:
            return ([attributes(rs.resource.attributes) for req in self._got.traces
                     for rs in req.resource_spans]
                    + [attributes(rm.resource.attributes) for req in self._got.metrics
                       for rm in req.resource_metrics])

    def metrics(self) -> dict[str, list[Any]]:
        """Metric name -> every received ``Metric`` message of that name (one per export)."""
        out: dict[str, list[Any]] = {}
        with self._got.lock:
            for req in self._got.metrics:
                for rm in req.resource_metrics:
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            out.setdefault(m.name, []).append(m)
        return out

    def wait(self, cond: Callable[[OtlpSink], bool], timeout_s: float = 10.0) -> None:
        """Poll (bounded) until ``cond(self)`` holds.

        Raises:
            AssertionError: It did not hold within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while not cond(self):
            if time.monotonic() > deadline:
                raise AssertionError(f"OTLP sink: condition not met in {timeout_s} s; got "
                                     f"{[s.name for s in self.spans()]} {sorted(self.metrics())}")
            time.sleep(0.05)
