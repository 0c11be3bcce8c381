"""The fleet's sections of the gateway config: ``models:`` (each model and the pool of replicas
that serve it) and ``health:`` (passive ejection, active probing).

Read by :mod:`gateway.routing` (pools, strategies, cool-down; each replica's ``kind`` and the
model's upstream name, copied once for the relay), :mod:`gateway.health` (the active prober)
and :mod:`gateway.egress` (each replica's policy destination).

```yaml
models:
  - name: llama-3.1-8b
    aliases: [default]
    strategy: prefix_affinity
    replicas:
      - {url: http://10.0.0.11:8000, api_key_env: VLLM_KEY, destination: vllm-a}
health: {cooldown_s: 10, interval_s: 5, timeout_s: 2, path: /health}
```
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.config.base import ENV_NAME, FrozenSection
from gateway.config.url_paths import UrlPath

__all__ = ["HealthSettings", "ModelSettings", "ReplicaSettings"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")
_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?"
_DNS_NAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*\.?$")


def _valid_host(host: str) -> bool:
    """A DNS name (letters, digits, ``-``, ``_``; dot-separated labels) or an IP literal."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return len(host) <= 253 and _DNS_NAME.match(host) is not None
    return True


class ReplicaSettings(FrozenSection):
    """One backend replica (a vLLM server).

    ``url`` is the server root (``http://10.0.0.11:8000``), without ``/v1``; when the file gives
    only ``destination``, :func:`gateway.config.loader.parse` takes it from that policy
    destination's ``url`` (:mod:`gateway.config.replica_urls`). The credential comes from
    ``api_key_env`` or ``api_key_file``; :func:`gateway.config.loader.load` fills ``api_key``.
    """

    url: str
    api_key_env: str | None = None
    api_key_file: Path | None = None
    # Policy destination id: which egress destination this replica is.
    destination: str | None = None
    # "vllm": the byte relay (default). "litellm": called through litellm as a library, with
    # ``litellm_model`` naming the provider adapter and model (e.g. "hosted_vllm/<name>").
    kind: Literal["vllm", "litellm"] = "vllm"
    litellm_model: str | None = None
    api_key: SecretStr | None = Field(default=None, exclude=True)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https"):
            raise ValueError("must be an http:// or https:// URL")
        if not parts.hostname:
            raise ValueError("has no host")
        if not _valid_host(parts.hostname):
            raise ValueError(f"has an invalid host {parts.hostname!r}")
        if parts.path.rstrip("/").endswith("/v1"):
            raise ValueError("must be the server root without /v1 (the gateway appends /v1/...)")
        if parts.username or parts.password:
            raise ValueError("must not contain credentials; use api_key_env or api_key_file")
        if parts.query or parts.fragment:
            raise ValueError("must not contain a query or fragment")
        try:
            _ = parts.port
        except ValueError as exc:
            raise ValueError(f"has an invalid port: {exc}") from exc
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _check_env(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.match(value):
            raise ValueError("is not a valid environment variable name")
        return value

    @model_validator(mode="after")
    def _one_secret_source(self) -> ReplicaSettings:
        if self.api_key_env and self.api_key_file:
            raise ValueError("set either api_key_env or api_key_file, not both")
        if (self.kind == "litellm") != (self.litellm_model is not None):
            raise ValueError("litellm_model is required with kind litellm (and only then)")
        return self


class ModelSettings(FrozenSection):
    """A model clients can ask for, and the pool of replicas that serve it."""

    name: str
    aliases: list[str] = Field(default_factory=list)
    served_model_name: str | None = None
    strategy: Literal["least_outstanding", "round_robin", "prefix_affinity"] = "least_outstanding"
    replicas: list[ReplicaSettings] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be 1-200 characters of letters, digits and ._:/@+-")
        return value

    @field_validator("aliases")
    @classmethod
    def _check_aliases(cls, value: list[str]) -> list[str]:
        for alias in value:
            if not _NAME.match(alias):
                raise ValueError(f"alias {alias!r} must be letters, digits and ._:/@+-")
        return value

    @property
    def upstream_name(self) -> str:
        """The model name the backend expects (``served_model_name``, else ``name``)."""
        return self.served_model_name or self.name


class HealthSettings(FrozenSection):
    """Passive ejection and active ``GET /health`` probing. Durations in seconds."""

    cooldown_s: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    interval_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    timeout_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)
    path: UrlPath = "/health"
    active: bool = True
