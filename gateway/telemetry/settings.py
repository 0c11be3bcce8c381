"""The ``telemetry:`` section of the gateway config.

```yaml
telemetry:
  otlp_endpoint: http://10.0.9.5:4318          # OTLP/HTTP collector base URL, or null
  otlp_endpoint_destination: otel-collector    # the egress-policy destination it must lie in
  service_name: sovereign-gateway
  sample_ratio: 1.0                            # head sampling of traces (0..1)
  export_interval_s: 15                        # OTLP metric export period
  admin: {host: 127.0.0.1, port: 9090}         # Prometheus /metrics (not the client port)
```

Without an ``otlp_endpoint`` nothing is exported and no connection is ever attempted. The root
model (:class:`gateway.config.settings.GatewaySettings`) validates the section with the rest
of the file at load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator

from gateway.config.base import FrozenSection

__all__ = ["AdminSettings", "TelemetrySettings", "telemetry_settings"]


class AdminSettings(FrozenSection):
    """Where the admin HTTP server (``/metrics``) listens."""

    host: str = "127.0.0.1"
    port: int = Field(default=9090, ge=0, le=65535)


class TelemetrySettings(FrozenSection):
    """Traces, metrics and their exporters.

    Attributes:
        enabled: Telemetry on (spans, metrics, ``/metrics``); off skips everything.
        otlp_endpoint: OTLP/HTTP base URL (``/v1/traces`` and ``/v1/metrics`` are appended).
        otlp_endpoint_destination: Egress-policy destination id the endpoint must lie in.
        otlp_headers: Extra headers sent to the collector (e.g. a tenant id).
        otlp_timeout_s: Per-export timeout in seconds.
        service_name: ``service.name`` resource attribute.
        sample_ratio: Fraction of new traces sampled (client ``traceparent`` sampling wins).
        export_interval_s: OTLP metric export period in seconds.
        admin: The admin server (Prometheus ``/metrics``).
    """

    enabled: bool = True
    otlp_endpoint: str | None = None
    otlp_endpoint_destination: str | None = Field(default=None, validate_default=True)
    otlp_headers: dict[str, str] = Field(default_factory=dict)
    otlp_timeout_s: float = Field(default=5.0, gt=0)
    service_name: str = Field(default="sovereign-gateway", min_length=1)
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    export_interval_s: float = Field(default=15.0, gt=0)
    admin: AdminSettings = Field(default_factory=AdminSettings)

    @field_validator("otlp_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ValueError("must not contain credentials, a query or a fragment")
        return value.rstrip("/")

    @field_validator("otlp_endpoint_destination", mode="after")
    @classmethod
    def _destination_with_endpoint(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and info.data.get("otlp_endpoint") is not None:
            raise ValueError("required with otlp_endpoint (the collector must be a destination "
                             "of the egress policy)")
        return value


def telemetry_settings(
    section: TelemetrySettings | Mapping[str, Any] | None,
) -> TelemetrySettings | None:
    """The ``telemetry:`` section when present and enabled, else ``None``.

    Args:
        section: ``GatewaySettings.telemetry`` (validated at load), or a mapping.

    Raises:
        pydantic.ValidationError: A mapping that is not a valid section.
    """
    if section is None:
        return None
    ts = section if isinstance(section, TelemetrySettings) else (
        TelemetrySettings.model_validate(section))
    return ts if ts.enabled else None
