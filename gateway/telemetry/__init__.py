"""Observability: OpenTelemetry traces and metrics, Prometheus ``/metrics``.

Public API: :class:`Telemetry`, :func:`build_telemetry`, :func:`check_telemetry`,
:class:`TelemetrySettings`, :func:`telemetry_settings`, :func:`prometheus_name`.
"""

from gateway.telemetry.prometheus import prometheus_name
from gateway.telemetry.service import Telemetry, build_telemetry, check_telemetry
from gateway.telemetry.settings import TelemetrySettings, telemetry_settings

__all__ = [
    "Telemetry",
    "TelemetrySettings",
    "build_telemetry",
    "check_telemetry",
    "prometheus_name",
    "telemetry_settings",
]
