"""Observability: OpenTelemetry traces and metrics, Prometheus ``/metrics``.

Public API: :class:`Telemetry`, :func:`build_telemetry`, :func:`check_telemetry`,
:class:`TelemetrySettings`, :func:`telemetry_settings`, :func:`prometheus_name`.

Only the settings are imported with the package: the root config model
(:mod:`gateway.config.settings`) imports :mod:`gateway.telemetry.settings`, and the service
imports the root model back, so the service (and the OpenTelemetry SDK, which the CLI commands
that only load a config should not pay for) is imported on first use (PEP 562).
"""

from typing import TYPE_CHECKING, Any

from gateway.telemetry.settings import TelemetrySettings, telemetry_settings

if TYPE_CHECKING:
    from gateway.telemetry.check import check_telemetry
    from gateway.telemetry.prometheus import prometheus_name
    from gateway.telemetry.service import Telemetry, build_telemetry

#: Public name -> defining module, imported on first access.
_LAZY = {
    "prometheus_name": "gateway.telemetry.prometheus",
    "Telemetry": "gateway.telemetry.service",
    "build_telemetry": "gateway.telemetry.service",
    "check_telemetry": "gateway.telemetry.check",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access (PEP 562).

    Raises:
        AttributeError: ``name`` is not a public name of the package (nor a submodule).
    """
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Telemetry",
    "TelemetrySettings",
    "build_telemetry",
    "check_telemetry",
    "prometheus_name",
    "telemetry_settings",
]
