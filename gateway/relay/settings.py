"""The relay's sections of the gateway config: ``timeouts:``, ``retries:`` and
``upstream_tls:`` (the relay's calls to the replicas).

Read by :mod:`gateway.relay.forward` (deadlines, retries, Retry-After), the pooled upstream
client (:mod:`gateway.relay.upstream`, :mod:`gateway.h1`) and the health prober's session.

```yaml
timeouts: {connect_s: 2, first_byte_s: 60, idle_s: 30, upstream_keep_alive_s: 2}
retries: {max_attempts: 3, max_retry_after_s: 2, retry_after_cap_s: 300}
upstream_tls: {ca_file: /etc/gateway/backend-ca.pem}
```
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from gateway.config.base import FrozenSection

__all__ = ["RetrySettings", "TimeoutSettings", "UpstreamTlsSettings"]


class UpstreamTlsSettings(FrozenSection):
    """TLS towards ``https://`` replicas (certificates are always verified).

    ``ca_file``: PEM bundle of the CAs that sign the backends' certificates (default: the
    system store). ``cert_file``/``key_file``: client certificate for mutual TLS.
    """

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @model_validator(mode="after")
    def _client_pair(self) -> UpstreamTlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("set both cert_file and key_file, or neither")
        return self


class TimeoutSettings(FrozenSection):
    """Upstream timeouts in seconds."""

    connect_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)
    first_byte_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    idle_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    # How long an idle pooled upstream connection is kept for reuse. Keep it below the backends'
    # keep-alive timeout (vLLM/uvicorn: 5 s) so the gateway rarely reuses a connection the
    # backend is closing; a reused connection found closed is retried on a fresh one anyway.
    upstream_keep_alive_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)


class RetrySettings(FrozenSection):
    """Retries to another replica (only before the first byte reached the client)."""

    max_attempts: int = Field(default=3, ge=1, le=10)
    # A 429's Retry-After longer than this is relayed to the client instead of waited out.
    max_retry_after_s: float = Field(default=2.0, ge=0, allow_inf_nan=False)
    # A replica's Retry-After is capped at this (relayed to the client, and the replica's
    # cool-down); an invalid one is dropped (gateway/relay/retry_after.py).
    retry_after_cap_s: float = Field(default=300.0, ge=0, allow_inf_nan=False)
