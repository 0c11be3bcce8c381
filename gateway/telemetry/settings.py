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

Without an ``otlp_endpoint`` nothing is exported and no connection is ever attempted.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.errors import ConfigError

__all__ = ["AdminSettings", "TelemetrySettings", "telemetry_settings"]


class AdminSettings(BaseModel):
    """Where the admin HTTP server (``/metrics``) listens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=9090, ge=0, le=65535)


class TelemetrySettings(BaseModel):
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

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    otlp_endpoint: str | None = None
    otlp_endpoint_destination: str | None = None
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


def telemetry_settings(section: object) -> TelemetrySettings | None:
    """Validate the ``telemetry:`` section (``None`` when absent or disabled).

    Raises:
        ConfigError: Naming the key (``telemetry.sample_ratio: ...``); an endpoint without a
            destination is refused.
    """
    if section is None:
        return None
    try:
        ts = TelemetrySettings.model_validate(section)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"telemetry.{where}: {msg}" if where else f"telemetry: {msg}") from exc
    if ts.otlp_endpoint is not None and ts.otlp_endpoint_destination is None:
        raise ConfigError(
            "telemetry.otlp_endpoint_destination: required with otlp_endpoint (the collector "
            "must be a destination of the egress policy)"
        )
    return ts if ts.enabled else None
