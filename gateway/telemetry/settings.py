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

Without an ``otlp_endpoint`` nothing is exported and no connection is ever attempted. The models
live in :mod:`gateway.config.settings` (validated with the rest of the file at load) and are
re-exported
here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.config.settings import AdminSettings, TelemetrySettings

__all__ = ["AdminSettings", "TelemetrySettings", "telemetry_settings"]


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
