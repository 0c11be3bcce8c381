"""Gateway configuration: the frozen pydantic-settings model of the one YAML file (its loader:
:mod:`gateway.config.loader`).

Secrets never live in the file: a replica names the environment variable (``api_key_env``) or the
file (``api_key_file``, for Kubernetes secrets mounted as files) that holds its credential, and
:func:`gateway.config.loader.load` resolves it from the ``environ`` mapping it is given
(never ``os.environ`` at import).

Every section is a typed, frozen model validated once by the loader
(:mod:`gateway.config.loader`):
``policy`` (:class:`PolicySettings`), ``audit`` (``gateway.audit.settings``), ``quotas``
(``gateway.quotas.settings``), ``keystore`` (``gateway.keystore.settings``), ``flow_control``
(``gateway.flow.settings``) and ``telemetry`` (:class:`TelemetrySettings`). Problems are
reported by the one formatter of :mod:`gateway.config.errors` as ``file:line: key: problem``
lines, and every relative path of every section is resolved against the config file's
directory in one place (the loader).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gateway.audit.settings import AuditSettings
from gateway.batch.settings import (
    NO_DATABASE,
    BatchSettings,
    audit_store_url,
    default_location,
)
from gateway.config.errors import (
    ConfigProblem,
    LineMap,
    problems_of,
)
from gateway.config.url_paths import UrlPath, url_path_fields, url_path_problem
from gateway.errors import ConfigError
from gateway.fleet.settings import RoutingSettings, check_endpoint
from gateway.flow.settings import FlowControlSettings
from gateway.identity.settings import IdentitySettings
from gateway.keystore.settings import KeystoreSettings
from gateway.mcp.settings import McpSettings
from gateway.preflight.live_settings import ContinuousSettings
from gateway.quotas.settings import QuotaSettings
from gateway.serving.drain import DrainSettings

_M = TypeVar("_M", bound=BaseModel)

__all__ = [
    "AdminSettings",
    "GatewaySettings",
    "HealthSettings",
    "KeySettings",
    "LimitSettings",
    "ListenSettings",
    "LoggingSettings",
    "ModelSettings",
    "PolicySettings",
    "ReloadSettings",
    "ReplicaSettings",
    "RetrySettings",
    "TelemetrySettings",
    "TimeoutSettings",
    "UpstreamTlsSettings",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")
_KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""An environment variable's name (``api_key_env``, ``${NAME}`` references)."""
_HEADER = re.compile(r"^[a-z0-9-]+$")
# Headers that carry client identity or connection state: never forwardable, whatever the config.
_NEVER_FORWARD = frozenset(
    {
        "authorization", "proxy-authorization", "cookie", "set-cookie", "host", "connection",
        "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "proxy-connection",
        "content-length", "content-encoding", "accept-encoding", "x-api-key", "api-key",
        "forwarded", "x-forwarded-for", "x-forwarded-host", "x-real-ip",
    }
)


_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?"
_DNS_NAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*\.?$")


def _valid_host(host: str) -> bool:
    """A DNS name (letters, digits, ``-``, ``_``; dot-separated labels) or an IP literal."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return len(host) <= 253 and _DNS_NAME.match(host) is not None
    return True


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ListenSettings(_Frozen):
    """Where the gateway listens; with ``tls_cert_file`` and ``tls_key_file`` it serves HTTPS."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None

    @model_validator(mode="after")
    def _tls_pair(self) -> ListenSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("set both tls_cert_file and tls_key_file, or neither")
        return self


class UpstreamTlsSettings(_Frozen):
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


class ReplicaSettings(_Frozen):
    """One backend replica (a vLLM server).

    ``url`` is the server root (``http://10.0.0.11:8000``), without ``/v1``; when the file gives
    only ``destination``, :func:`parse` takes it from that policy destination's ``url``
    (:mod:`gateway.config.replica_urls`). The credential comes from ``api_key_env`` or
    ``api_key_file``; :func:`load` fills ``api_key``.
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


class ModelSettings(_Frozen):
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


class KeySettings(_Frozen):
    """A client API key, stored as the SHA-256 hex digest of the key string."""

    id: str
    sha256: str
    models: list[str] = Field(default_factory=list)
    team: str | None = None
    data_class: str = "internal"

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if not _KEY_ID.match(value):
            raise ValueError("must be 1-128 characters of letters, digits and ._-")
        return value

    @field_validator("sha256")
    @classmethod
    def _check_digest(cls, value: str) -> str:
        value = value.strip().lower()
        if not _HEX64.match(value):
            raise ValueError("must be 64 hex characters (sha256 of the key; `gateway keys new`)")
        return value


class LimitSettings(_Frozen):
    """Request limits. Sizes in bytes."""

    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    # Longest silence (seconds) while a client sends its request body before 408 (slow clients).
    client_body_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    # Seconds a client connection may take to send a complete request head (from the moment it
    # opens, or from the first byte of a later request on a kept-alive connection).
    client_header_timeout_s: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    # Seconds an idle keep-alive client connection is kept open between requests.
    keep_alive_timeout_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    # Seconds a client may leave its socket buffer full (not reading) while a response is
    # written before its connection is closed (and its upstream request ended).
    client_send_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    # Concurrent client connections; one more is answered 503 at once and closed.
    max_client_connections: int = Field(default=4096, gt=0)
    max_upstream_connections: int = Field(default=4096, ge=0)
    # Extra request headers relayed to backends (lower-case), e.g. tracing headers.
    forward_headers: list[str] = Field(default_factory=lambda: ["traceparent", "tracestate"])

    @field_validator("forward_headers")
    @classmethod
    def _check_headers(cls, value: list[str]) -> list[str]:
        out = []
        for name in value:
            low = name.lower()
            if not _HEADER.match(low):
                raise ValueError(f"{name!r} is not a header name")
            if low in _NEVER_FORWARD:
                raise ValueError(f"{name!r} carries client credentials or connection state")
            out.append(low)
        return out


class TimeoutSettings(_Frozen):
    """Upstream timeouts in seconds."""

    connect_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)
    first_byte_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    idle_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    # How long an idle pooled upstream connection is kept for reuse. Keep it below the backends'
    # keep-alive timeout (vLLM/uvicorn: 5 s) so the gateway rarely reuses a connection the
    # backend is closing; a reused connection found closed is retried on a fresh one anyway.
    upstream_keep_alive_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)


class RetrySettings(_Frozen):
    """Retries to another replica (only before the first byte reached the client)."""

    max_attempts: int = Field(default=3, ge=1, le=10)
    # A 429's Retry-After longer than this is relayed to the client instead of waited out.
    max_retry_after_s: float = Field(default=2.0, ge=0, allow_inf_nan=False)
    # A replica's Retry-After is capped at this (relayed to the client, and the replica's
    # cool-down); an invalid one is dropped (gateway/relay/retry_after.py).
    retry_after_cap_s: float = Field(default=300.0, ge=0, allow_inf_nan=False)


class HealthSettings(_Frozen):
    """Passive ejection and active ``GET /health`` probing. Durations in seconds."""

    cooldown_s: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    interval_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    timeout_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)
    path: UrlPath = "/health"
    active: bool = True


class LoggingSettings(_Frozen):
    """Process logging."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = True
    format: Literal["json", "text"] = "json"


class ReloadSettings(_Frozen):
    """Live reload (:mod:`gateway.serving.reload`): SIGHUP always reloads; ``watch`` also polls
    files.

    Attributes:
        watch: Poll the config file, its ``keys_file``, the policy file and the replicas'
            ``api_key_file`` every ``interval_s`` seconds and reload when their content
            changes (content hashes, so a Kubernetes ConfigMap/Secret symlink swap counts).
        interval_s: Seconds between two polls.
    """

    watch: bool = False
    interval_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)


class PolicySettings(_Frozen):
    """The ``policy:`` section: the egress policy file and the process guard.

    Attributes:
        file: Policy YAML file (relative paths are relative to the gateway config file).
        guard: Process egress guard mode (``enforce`` blocks, ``monitor`` only records).
    """

    file: Path
    guard: Literal["enforce", "monitor", "off"] = "enforce"


class AdminSettings(_Frozen):
    """Where the admin HTTP server (``/metrics``) listens."""

    host: str = "127.0.0.1"
    port: int = Field(default=9090, ge=0, le=65535)


class TelemetrySettings(_Frozen):
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


class GatewaySettings(BaseSettings):
    """The whole gateway configuration (frozen; built once by :func:`load`)."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    listen: ListenSettings = Field(default_factory=ListenSettings)
    models: list[ModelSettings] = Field(min_length=1)
    keys: list[KeySettings] = Field(default_factory=list)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)
    retries: RetrySettings = Field(default_factory=RetrySettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    upstream_tls: UpstreamTlsSettings = Field(default_factory=UpstreamTlsSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)  # gateway.fleet.settings
    drain: DrainSettings = Field(default_factory=DrainSettings)  # gateway.serving.drain
    reload: ReloadSettings = Field(default_factory=ReloadSettings)  # gateway.serving.reload
    flow_control: FlowControlSettings = Field(default_factory=FlowControlSettings)  # gateway.flow
    # Optional sections: absent (None) means the feature is off.
    policy: PolicySettings | None = None
    audit: AuditSettings | None = None
    quotas: QuotaSettings | None = None
    keystore: KeystoreSettings | None = None  # managed keys (store defaults to audit.store)
    telemetry: TelemetrySettings | None = None
    preflight: ContinuousSettings | None = None  # continuous pre-flight (gateway.preflight)
    identity: IdentitySettings | None = None  # gateway.identity: JWT and mTLS callers
    batch: BatchSettings | None = None  # the Batch API (gateway.batch)
    mcp: McpSettings | None = None  # gateway.mcp: MCP servers fronted at /mcp/<name>
    # Where the settings were read from (file, key path -> line), set by parse().
    _source: tuple[str | None, LineMap | None] = PrivateAttr(default=(None, None))
    _warnings: tuple[ConfigProblem, ...] = PrivateAttr(default=())

    @property
    def warnings(self) -> tuple[ConfigProblem, ...]:
        """Problems :func:`parse` tolerated instead of refusing (an override left behind by a
        key that a live reload removed, see :mod:`gateway.config.override_names`)."""
        return self._warnings

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Only the file: the environment is consulted explicitly by load() for named secrets,
        # never implicitly (a stray GATEWAY_* variable must not change a signed-off config).
        return (init_settings,)

    @model_validator(mode="after")
    def _cross_checks(self) -> GatewaySettings:
        seen: dict[str, str] = {}
        for i, model in enumerate(self.models):
            for label in (model.name, *model.aliases):
                if label in seen:
                    raise ValueError(
                        f"models[{i}]: name or alias {label!r} already used by {seen[label]!r}"
                    )
                seen[label] = model.name
        ids: set[str] = set()
        digests: set[str] = set()
        for i, key in enumerate(self.keys):
            if key.id in ids:
                raise ValueError(f"keys[{i}].id: duplicate key id {key.id!r}")
            if key.sha256 in digests:
                raise ValueError(f"keys[{i}].sha256: same digest as another key")
            ids.add(key.id)
            digests.add(key.sha256)
            for name in key.models:
                if name != "*" and name not in seen:
                    raise ValueError(f"keys[{i}].models: unknown model {name!r}")
                if name != "*" and seen[name] != name:
                    raise ValueError(
                        f"keys[{i}].models: {name!r} is an alias of {seen[name]!r}; "
                        "list the model name"
                    )
        flow = self.flow_control
        for where, names in (("models", flow.models),
                             ("vllm_priority_models", flow.vllm_priority_models)):
            for name in names:
                if seen.get(name) != name:
                    raise ValueError(f"flow_control.{where}: {name!r} is not a model name")
        # Prefill tokens in flight are counted by prefix_affinity's decision only: on another
        # strategy's model the threshold could never be reached (gateway.flow.saturation).
        plain = [m.name for m in self.models
                 if flow.covers(m.name) and m.strategy != "prefix_affinity"]
        for where in flow.prefill_thresholds() if plain else []:
            raise ValueError(
                f"flow_control.{where}.prefill_tokens: prefill tokens in flight are counted "
                f"only for models with strategy prefix_affinity, and flow control covers "
                f"{', '.join(map(repr, plain))} with another strategy; set their strategy to "
                "prefix_affinity or leave prefill_tokens out")
        urls = {r.url for m in self.models for r in m.replicas}
        for i, src in enumerate(self.routing.kv_events):  # gateway.fleet.kv_subscriber
            if src.replica not in urls:
                raise ValueError(f"routing.kv_events[{i}].replica: {src.replica!r} is not the "
                                 "url of any model's replica")
            for field_name in ("endpoint", "replay_endpoint"):
                value = getattr(src, field_name)
                if value is not None:
                    try:
                        check_endpoint(value, src.replica)
                    except ValueError as exc:
                        raise ValueError(f"routing.kv_events[{i}].{field_name}: {exc}") from None
        for where, path in url_path_fields(self):  # every section's, typed UrlPath or not
            problem = url_path_problem(path)
            if problem is not None:
                raise ValueError(f"{where}: {problem}")
        ks = self.keystore
        if ks is not None and ks.enabled and ks.store is None and self.audit is None:
            raise ValueError("keystore.store: store is not set and there is no audit section "
                             "(managed keys default to the audit store)")
        bs = self.batch
        if (bs is not None and bs.enabled
                and not (self.audit is not None and self.audit.store_file is not None)
                and default_location(bs, audit_store_url(self.audit)) is None):
            raise ValueError(NO_DATABASE)
        pf = self.preflight
        if pf is not None and pf.enabled and (self.telemetry is None or not self.telemetry.enabled):
            raise ValueError("preflight: the continuous pre-flight reports on the admin port: "
                             "add a telemetry section (telemetry.admin)")
        return self

    def problems_of(self, exc: ConfigError) -> list[ConfigProblem]:
        """The problems of ``exc`` (raised by a check of these settings: policy binding, TLS
        files, audit key files) as ``file:line: key: problem``, located in the config file."""
        file, lines = self._source
        return problems_of(exc, file=file, lines=lines)

    def model_by_label(self) -> dict[str, ModelSettings]:
        """Map every model name and alias to its :class:`ModelSettings`."""
        out: dict[str, ModelSettings] = {}
        for model in self.models:
            out[model.name] = model
            for alias in model.aliases:
                out[alias] = model
        return out


def is_loopback_host(host: str) -> bool:
    """True when ``host`` is a loopback literal or ``localhost`` (used for start-up warnings)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

