"""Gateway configuration: the frozen pydantic-settings model of the one YAML file (its loader:
:mod:`gateway.config.loader`).

This module holds the root model only: which sections there are, and the checks that span
sections (model names and aliases unique, keys naming known models, flow control and KV-event
sources naming models and replicas, URL paths, the defaults one section takes from another).
Each section lives next to the code that reads it and builds on :mod:`gateway.config.base`:

==================  ===============================================================
``listen``          :class:`gateway.serving.settings.ListenSettings`
``limits``          :class:`gateway.serving.settings.LimitSettings`
``reload``          :class:`gateway.serving.settings.ReloadSettings`
``drain``           :class:`gateway.serving.drain.DrainSettings`
``models``          :class:`gateway.fleet.model_settings.ModelSettings` (and ``ReplicaSettings``)
``health``          :class:`gateway.fleet.model_settings.HealthSettings`
``routing``         :class:`gateway.fleet.settings.RoutingSettings`
``timeouts``        :class:`gateway.relay.settings.TimeoutSettings`
``retries``         :class:`gateway.relay.settings.RetrySettings`
``upstream_tls``    :class:`gateway.relay.settings.UpstreamTlsSettings`
``keys``            :class:`gateway.auth.KeySettings`
``logging``         :class:`gateway.logs.LoggingSettings`
``policy``          :class:`gateway.egress_settings.PolicySettings`
``telemetry``       :class:`gateway.telemetry.settings.TelemetrySettings`
``flow_control``    :class:`gateway.flow.settings.FlowControlSettings`
``audit``           :class:`gateway.audit.settings.AuditSettings`
``quotas``          :class:`gateway.quotas.settings.QuotaSettings`
``keystore``        :class:`gateway.keystore.settings.KeystoreSettings`
``preflight``       :class:`gateway.preflight.live_settings.ContinuousSettings`
``identity``        :class:`gateway.identity.settings.IdentitySettings`
``batch``           :class:`gateway.batch.settings.BatchSettings`
``mcp``             :class:`gateway.mcp.settings.McpSettings`
==================  ===============================================================

A section module never imports this one (it would close an import circle); this module
imports them all.

Secrets never live in the file: a replica names the environment variable (``api_key_env``) or the
file (``api_key_file``, for Kubernetes secrets mounted as files) that holds its credential, and
:func:`gateway.config.loader.load` resolves it from the ``environ`` mapping it is given
(never ``os.environ`` at import). Problems are reported by the one formatter of
:mod:`gateway.config.errors` as ``file:line: key: problem`` lines, and every relative path of
every section is resolved against the config file's directory in one place (the loader).
"""

from __future__ import annotations

from pydantic import Field, PrivateAttr, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gateway.audit.settings import AuditSettings
from gateway.auth import KeySettings
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
from gateway.config.url_paths import url_path_fields, url_path_problem
from gateway.egress_settings import PolicySettings
from gateway.errors import ConfigError
from gateway.fleet.model_settings import HealthSettings, ModelSettings
from gateway.fleet.settings import RoutingSettings, check_endpoint
from gateway.flow.settings import FlowControlSettings
from gateway.identity.settings import IdentitySettings
from gateway.keystore.settings import KeystoreSettings
from gateway.logs import LoggingSettings
from gateway.mcp.settings import McpSettings
from gateway.preflight.live_settings import ContinuousSettings
from gateway.quotas.settings import QuotaSettings
from gateway.relay.settings import RetrySettings, TimeoutSettings, UpstreamTlsSettings
from gateway.serving.drain import DrainSettings
from gateway.serving.settings import LimitSettings, ListenSettings, ReloadSettings
from gateway.telemetry.settings import TelemetrySettings

__all__ = ["GatewaySettings"]


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
        _check_flow_models(flow, [m.name for m in self.models], seen)
        _check_reserve_pools(flow, self.models)
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
        if bs is not None and bs.enabled and self.flow_control.enabled:
            names = [c.name for c in self.flow_control.classes]
            if bs.priority_class not in names:
                default = "" if "priority_class" in bs.model_fields_set else " (the default)"
                raise ValueError(
                    f"batch.priority_class: {bs.priority_class!r}{default} is not a class of "
                    f"flow_control.classes ({', '.join(names)}): batch requests would run in "
                    "their key's class; set it to one of them")
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



def _check_flow_models(flow: FlowControlSettings, known: list[str],
                       labels: dict[str, str]) -> None:
    """Refuse a model name in a ``flow_control`` setting that names no model the setting
    acts on (a typo there would silently configure nothing).

    Args:
        flow: The ``flow_control`` section.
        known: The config's model names, in config order.
        labels: Every model name and alias -> its model's name.

    Raises:
        ValueError: ``flow_control.<setting>[i]: <problem>``, naming the known models: the
            name is no model, is an alias (flow control names models by name), or names a
            model not under flow control in a setting that acts only on those
            (:meth:`~gateway.flow.settings.FlowControlSettings.model_references`).
    """
    for where, names, flow_controlled in flow.model_references():
        for i, name in enumerate(names):
            key = f"flow_control.{where}[{i}]"
            if name not in labels:
                raise ValueError(f"{key}: {name!r} is not a model name (models: "
                                 f"{', '.join(known)})")
            if labels[name] != name:
                raise ValueError(f"{key}: {name!r} is an alias of {labels[name]!r}; list the "
                                 "model name")
            if flow_controlled and flow.models and name not in flow.models:
                raise ValueError(f"{key}: {name!r} is not under flow control, so this would "
                                 f"never apply to it (flow_control.models: "
                                 f"{', '.join(flow.models)}); add it there or remove it here")


def _check_reserve_pools(flow: FlowControlSettings, models: list[ModelSettings]) -> None:
    """Refuse a ``flow_control.reserve`` that can never reserve a replica: a pool with no more
    replicas than ``reserve.replicas`` has no reserve (:mod:`gateway.flow.reserve`), which is
    refused for a model ``reserve.models`` names, and when no model it applies to has more.

    Raises:
        ValueError: ``flow_control.reserve.models[i]: ...`` or ``flow_control.reserve.replicas:
            ...``, naming the models and their replica counts.
    """
    reserve = flow.reserve
    if reserve is None or not flow.enabled:
        return
    sizes = {m.name: len(m.replicas) for m in models}
    want = reserve.replicas
    for i, name in enumerate(reserve.models):
        if sizes.get(name, want + 1) <= want:
            raise ValueError(
                f"flow_control.reserve.models[{i}]: {name!r} has {sizes[name]} "
                f"replica{'s' * (sizes[name] != 1)}, not more than reserve.replicas {want}: "
                "no replica would be left to the classes below, so it would never have a "
                "reserve; give it more replicas or set reserve.replicas lower")
    applies = reserve.models or [m for m in sizes if flow.covers(m)]
    if applies and all(sizes.get(m, want + 1) <= want for m in applies):
        listed = ", ".join(f"{m!r} ({sizes[m]})" for m in applies)
        raise ValueError(
            f"flow_control.reserve.replicas: {want} is not less than the replicas of any model "
            f"the reserve applies to ({listed}): no model would ever have a reserve; set it "
            "lower or give the models more replicas")
