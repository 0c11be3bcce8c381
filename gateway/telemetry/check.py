"""Checking the ``telemetry:`` section without building the telemetry service.

Apart from :mod:`gateway.telemetry.service` so that a gateway without telemetry (and
``gateway check-config``) checks its section without importing the OpenTelemetry SDK, the
``requests`` library of its OTLP exporters and the admin server: about a tenth of the import
time of every ``gateway serve``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.errors import ConfigError
from gateway.telemetry.settings import TelemetrySettings, telemetry_settings

if TYPE_CHECKING:
    from gateway.config.settings import GatewaySettings

__all__ = ["check_endpoint", "check_telemetry"]


def check_endpoint(ts: TelemetrySettings, policy: Any) -> None:
    """Check that the OTLP collector lies inside its egress-policy destination.

    Args:
        ts: The validated ``telemetry:`` section.
        policy: The egress policy (``policy.Policy``), or ``None`` when none is configured.

    Raises:
        ConfigError: An ``otlp_endpoint`` without a policy, or outside
            ``otlp_endpoint_destination``.
    """
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


def check_telemetry(settings: GatewaySettings, policy: Any = None) -> TelemetrySettings | None:
    """Validate the ``telemetry:`` section without starting anything (``gateway check-config``).

    Args:
        settings: The gateway settings.
        policy: The egress policy (``policy.Policy``), or ``None``.

    Returns:
        The section, or ``None`` when it is absent or disabled.

    Raises:
        ConfigError: Invalid section or collector outside its policy destination.
    """
    ts = telemetry_settings(settings.telemetry)
    if ts is not None:
        check_endpoint(ts, policy)
    return ts
