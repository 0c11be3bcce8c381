"""Gateway configuration: one YAML file validated by a frozen pydantic-settings model.

Secrets never live in the file: a replica names the environment variable (``api_key_env``) or the
file (``api_key_file``, for Kubernetes secrets mounted as files) that holds its credential, and
:func:`load` resolves it from the ``environ`` mapping it is given (never ``os.environ`` at import).

Later issues add sections (``policy``, ``audit``, ``quotas``, ``telemetry``); they are accepted
now as free-form mappings so a config written for a later version still validates here.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gateway.errors import ConfigError
from gateway.keys_file import merge_keys_file, relabel_keys

__all__ = [
    "GatewaySettings",
    "HealthSettings",
    "KeySettings",
    "LimitSettings",
    "ListenSettings",
    "LoggingSettings",
    "ModelSettings",
    "ReplicaSettings",
    "RetrySettings",
    "TimeoutSettings",
    "UpstreamTlsSettings",
    "format_validation_error",
    "load",
    "parse",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")
_KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
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

    ``url`` is the server root (``http://10.0.0.11:8000``), without ``/v1``. The credential comes
    from ``api_key_env`` or ``api_key_file``; :func:`load` fills ``api_key``.
    """

    url: str
    api_key_env: str | None = None
    api_key_file: Path | None = None
    # Policy destination id (issue 3): which egress destination this replica is.
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
        if value is not None and not _ENV_NAME.match(value):
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
    strategy: Literal["least_outstanding", "round_robin"] = "least_outstanding"
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


class HealthSettings(_Frozen):
    """Passive ejection and active ``GET /health`` probing. Durations in seconds."""

    cooldown_s: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    interval_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    timeout_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)
    path: str = "/health"
    active: bool = True

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with / (it is appended to each replica URL)")
        return value


class LoggingSettings(_Frozen):
    """Process logging."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = True
    format: Literal["json", "text"] = "json"


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
    # Sections owned by later issues; typed models replace these mappings when they land.
    policy: dict[str, Any] | None = None
    audit: dict[str, Any] | None = None
    quotas: dict[str, Any] | None = None
    keystore: dict[str, Any] | None = None  # managed keys (issue 9): gateway.keystore.settings
    telemetry: dict[str, Any] | None = None

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
        return self

    def model_by_label(self) -> dict[str, ModelSettings]:
        """Map every model name and alias to its :class:`ModelSettings`."""
        out: dict[str, ModelSettings] = {}
        for model in self.models:
            out[model.name] = model
            for alias in model.aliases:
                out[alias] = model
        return out


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem: ``dotted.key[index]: message``."""
    lines = []
    for err in exc.errors():
        loc = ""
        for part in err["loc"]:
            loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{loc or '(top level)'}: {msg}")
    return "; ".join(lines)


def _resolve_secrets(data: dict[str, Any], environ: Mapping[str, str], base: Path) -> list[str]:
    """Fill ``api_key`` of each replica from its ``api_key_env`` / ``api_key_file``.

    Returns:
        One message per secret that could not be resolved (empty when all resolved).
    """
    problems: list[str] = []
    for i, model in enumerate(data.get("models") or []):
        if not isinstance(model, dict):
            continue
        for j, replica in enumerate(model.get("replicas") or []):
            if not isinstance(replica, dict):
                continue
            where = f"models[{i}].replicas[{j}]"
            if "api_key" in replica:
                problems.append(
                    f"{where}.api_key: secrets do not belong in the file; "
                    "use api_key_env or api_key_file"
                )
                del replica["api_key"]
                continue
            env_name = replica.get("api_key_env")
            file_name = replica.get("api_key_file")
            if isinstance(env_name, str) and _ENV_NAME.match(env_name):
                value = environ.get(env_name)
                if not value:
                    problems.append(
                        f"{where}.api_key_env: environment variable {env_name} is not set"
                    )
                    continue
                replica["api_key"] = value
            elif isinstance(file_name, str):
                path = Path(file_name)
                if not path.is_absolute():
                    path = base / path
                try:
                    value = path.read_text(encoding="utf-8").strip()
                except OSError as exc:
                    problems.append(f"{where}.api_key_file: cannot read {path}: {exc.strerror}")
                    continue
                if not value:
                    problems.append(f"{where}.api_key_file: {path} is empty")
                    continue
                replica["api_key"] = value
    return problems


def parse(
    data: Any, environ: Mapping[str, str] | None = None, base: Path | None = None
) -> GatewaySettings:
    """Validate an already-parsed config mapping.

    Args:
        data: The YAML document as Python objects.
        environ: Where ``api_key_env`` names are looked up (default: empty mapping).
        base: Directory relative ``api_key_file`` / ``keys_file`` paths are resolved against.
            ``keys_file`` (a YAML list shaped like ``keys``) is merged after the inline
            ``keys`` (see :mod:`gateway.keys_file`).

    Returns:
        The frozen settings.

    Raises:
        ConfigError: Naming each offending key and the problem.
    """
    if not isinstance(data, dict):
        raise ConfigError("(top level): the config must be a YAML mapping")
    data = _deep_copy(data)
    problems = _resolve_secrets(data, environ or {}, base or Path.cwd())
    key_labels, key_problems = merge_keys_file(data, base or Path.cwd())
    problems += key_problems
    _resolve_paths(data, base or Path.cwd())
    try:
        settings = GatewaySettings(**data)
    except ValidationError as exc:
        found = relabel_keys(format_validation_error(exc), key_labels)
        raise ConfigError("; ".join([found, *problems])) from exc
    if problems:
        raise ConfigError("; ".join(problems))
    return settings


def load(path: Path | str, environ: Mapping[str, str] | None = None) -> GatewaySettings:
    """Read and validate the YAML config file at ``path``.

    Raises:
        ConfigError: The file cannot be read, is not YAML, or is invalid (the message names
            the key, e.g. ``models[0].replicas[1].url: must be an http:// or https:// URL``).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        return parse(data, environ, path.parent)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: the YAML refers to itself or nests too deeply") from exc
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc.message}") from exc


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key repeated in one mapping (YAML 1.2 forbids it; PyYAML
    silently keeps the last one, so a reviewed file could mean something else than it shows)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                continue
            if key in seen:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: duplicate key {key!r}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _resolve_paths(data: dict[str, Any], base: Path) -> None:
    """Make the file paths of ``listen``, ``upstream_tls`` and ``audit`` relative to the config
    file (``audit.store: sqlite://PATH`` keeps its documented meaning)."""
    for section, keys in (("listen", ("tls_cert_file", "tls_key_file")),
                          ("upstream_tls", ("ca_file", "cert_file", "key_file")),
                          ("audit", ("signing_key_file", "pseudonym_key_file", "checkpoint_dir",
                                     "store_file"))):
        block = data.get(section)
        if not isinstance(block, dict):
            continue
        for key in keys:
            value = block.get(key)
            if isinstance(value, str) and value and not Path(value).is_absolute():
                block[key] = str(base / value)


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def is_loopback_host(host: str) -> bool:
    """True when ``host`` is a loopback literal or ``localhost`` (used for start-up warnings)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
