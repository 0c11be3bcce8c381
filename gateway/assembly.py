"""The gateway assembled in one place: every component built once from the settings.

:func:`assemble` is called by ``gateway serve`` (which then hands the result to
:func:`gateway.app.create_app`) and by ``gateway check-config`` (which only reports it), so both
validate the same sections in the same order. It builds, without opening any store or socket:

* the authenticator (config keys, plus managed keys of ``keystore:``),
* the egress policy's routing seam and policy-checked transport (``policy:``),
* the audit observer (``audit:``), the quota hook (``quotas:``), the telemetry (``telemetry:``),
* the router (replica pools) shared by the relay, the health prober and the metrics,
* flow control (``flow_control:``) over the router's pools.

:func:`reassemble` builds the gateway of a new configuration for a live reload
(:mod:`gateway.serving.reload`) from the running one, keeping its long-lived components.

The order in which a relayed request meets them is written down once, in
:meth:`Gateway.stages` (the relay, :mod:`gateway.relay.pipeline`, runs the stages in that order)::

    authenticate -> classify -> route -> admit -> audit -> forward -> account

Components talk through named hooks only (:mod:`gateway.relay.records`): the audit log is handed to
the quota hook and the egress policy as an event sink and to telemetry through its append
listener API; nothing looks another component up by type or patches it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp.client_middlewares import ClientMiddlewareType

from gateway.auth import Authenticator, KeyRing, principal_of
from gateway.config.settings import GatewaySettings
from gateway.h1 import AttemptObserver, Dialer
from gateway.relay.pipeline import STAGES as RELAY_STAGES
from gateway.relay.records import AdmissionHook, ObserverHooks, RequestObserver
from gateway.routing import AllowAll, RoutePolicy, Router, RouteTable

if TYPE_CHECKING:
    from gateway.audit.observer import AuditObserver
    from gateway.egress import EgressRuntime
    from gateway.flow.gate import FlowGate
    from gateway.mcp.endpoint import McpEndpoint
    from gateway.quotas.hook import QuotaHook
    from gateway.telemetry import Telemetry
    from policy import Policy

__all__ = ["STAGES", "Gateway", "assemble", "reassemble"]

STAGES = tuple(stage.name for stage in RELAY_STAGES)
"""The names of the relay's stages, in order (:data:`gateway.relay.pipeline.STAGES`)."""
"""The request stages of a relayed request, in the order the relay runs them."""


@dataclass(frozen=True, slots=True)
class Gateway:
    """The assembled components of one gateway (what ``create_app`` serves).

    Attributes:
        settings: The validated configuration.
        router: Replica pools by model (shared by relay, health prober and metrics).
        authenticator: API key -> principal.
        route_policy: Per-request replica selection and data-class resolution (the egress
            policy's ``PolicyRoutes``, or ``AllowAll``).
        admission: Admission hooks, in call order (telemetry's observer, quotas).
        observers: Request observers, in call order (audit, telemetry's observer, quotas).
        connector_factory: Builds the upstream aiohttp connector of the health prober and the
            metrics scraper (policy-checked with a policy; ``None``: a plain pooled connector).
        dialer: Opens the relay's upstream connections with the same resolver and socket
            factory (policy-checked with a policy; ``None``: the system resolver).
        upstream_middlewares: aiohttp client middlewares, outermost first (telemetry client
            spans). The egress policy needs none: its connector checks every connection.
        policy: The egress policy document, if configured.
        egress: The process egress guard runtime (``gateway serve`` only).
        audit: The audit observer, if ``audit:`` is enabled.
        quotas: The quota hook, if ``quotas:`` is enabled.
        telemetry: The telemetry, if ``telemetry:`` is enabled (or passed in).
        flow: Flow control, if ``flow_control.enabled`` (acts in the ``admit`` stage, after
            the admission hooks: a request the quotas refuse never queues).
        mcp: The MCP endpoint (``/mcp/<name>``), if ``mcp:`` is configured.
        pure_routes: ``route_policy`` decides from the model, key, team and data class alone,
            so its decisions are made once (the egress policy, ``AllowAll``).
        hooks: The observers' and admission hooks' bound hooks (built here, once).
        routes: The route table: ``route_policy``'s decisions for every configured key and
            model, decided here (:meth:`RouteTable.prefill`); the route step looks them up.
    """

    settings: GatewaySettings
    router: Router
    authenticator: Authenticator
    route_policy: RoutePolicy
    admission: tuple[AdmissionHook, ...] = ()
    observers: tuple[RequestObserver, ...] = ()
    connector_factory: Callable[[], Any] | None = None
    dialer: Dialer | None = None
    upstream_middlewares: tuple[ClientMiddlewareType, ...] = ()
    policy: Policy | None = None
    egress: EgressRuntime | None = None
    audit: AuditObserver | None = None
    quotas: QuotaHook | None = None
    telemetry: Telemetry | None = None
    flow: FlowGate | None = None
    mcp: McpEndpoint | None = None
    pure_routes: bool = False
    # Started and stopped with the app, after the others (the continuous pre-flight).
    background: tuple[object, ...] = ()
    hooks: ObserverHooks = field(init=False)
    routes: RouteTable = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hooks", ObserverHooks.of(self.observers, self.admission))
        routes = RouteTable(self.route_policy, memo=self.pure_routes)
        routes.prefill(self.router, (principal_of(k) for k in self.settings.keys))
        object.__setattr__(self, "routes", routes)

    @property
    def attempt_observers(self) -> tuple[AttemptObserver, ...]:
        """Told about every upstream attempt of the relay's client (telemetry's client spans)."""
        return (self.telemetry.tracer,) if self.telemetry is not None else ()

    @classmethod
    def of(
        cls,
        settings: GatewaySettings,
        *,
        router: Router | None = None,
        authenticator: Authenticator | None = None,
        route_policy: RoutePolicy | None = None,
        admission: Sequence[AdmissionHook] = (),
        observers: Sequence[RequestObserver] = (),
        connector_factory: Callable[[], Any] | None = None,
        dialer: Dialer | None = None,
        upstream_middlewares: Sequence[ClientMiddlewareType] = (),
    ) -> Gateway:
        """A gateway put together by hand (tests, embedding): defaults for what is not given.

        Defaults: the router of ``settings``, its config keys, every replica allowed, no hooks;
        flow control as ``settings.flow_control`` says.
        A ``route_policy`` given here is asked on every request (it need not be pure).
        """
        router = router or Router(settings)
        return cls(
            settings=settings,
            router=router,
            authenticator=authenticator or KeyRing(settings.keys),
            route_policy=route_policy or AllowAll(),
            pure_routes=route_policy is None,
            admission=tuple(admission),
            observers=tuple(observers),
            connector_factory=connector_factory,
            dialer=dialer,
            upstream_middlewares=tuple(upstream_middlewares),
            flow=build_flow(settings, router),
        )

    def stages(self) -> list[tuple[str, tuple[object, ...]]]:
        """The request stages in the order the relay runs them
        (:data:`gateway.relay.pipeline.STAGES`), each with the components that act in it.

        ``authenticate`` (401), ``classify`` (data class from the classification header, by
        grant: 403), ``read`` (the bounded body: 413, 400), ``inspect`` (the policy's
        sensitive-data stage), ``route`` (model -> pool -> replicas the policy allows:
        403/404), ``admit`` (admission hooks, then flow control: 429), ``audit`` (observers'
        ``on_start``; the audit log makes ``request.started`` durable before a byte goes
        upstream: 503), ``forward`` (upstream session: connector and client middlewares),
        ``account`` (observers' ``on_end``: completion record, quota settlement, spans and
        metrics).
        """
        transport: tuple[object, ...] = (
            *((self.connector_factory,) if self.connector_factory else ()),
            *((self.dialer,) if self.dialer else ()),
            *self.upstream_middlewares,
        )
        pii = self.policy.pii if self.policy is not None else None
        stages = [
            ("authenticate", (self.authenticator,)),
            ("classify", (self.route_policy,)),
            ("read", ()),
            ("inspect", (pii,) if pii is not None else ()),
            ("route", (self.router, self.route_policy)),
            ("admit", (*self.admission, *((self.flow,) if self.flow is not None else ()))),
            ("audit", self.observers),
            ("forward", transport),
            ("account", self.observers),
        ]
        assert tuple(name for name, _ in stages) == STAGES
        return stages

    def lifespan_components(self) -> tuple[object, ...]:
        """Components whose ``startup()``/``shutdown()`` the app lifespan awaits, in order.

        The authenticator first (managed keys), then the observers and admission hooks (the
        audit log before the others, so they can record), the telemetry (admin server and
        exporters; its per-request observer is among the observers), the route policy last (it
        records ``policy.loaded``). Each component appears once.
        """
        seen: list[object] = []
        telemetry = (self.telemetry,) if self.telemetry is not None else ()
        mcp = (self.mcp,) if self.mcp is not None else ()
        for component in (self.authenticator, *self.observers, *self.admission, *telemetry,
                          self.route_policy, *self.background, *mcp):
            if not any(component is other for other in seen):
                seen.append(component)
        return tuple(seen)


def assemble(
    settings: GatewaySettings,
    base: Path | None = None,
    *,
    egress: EgressRuntime | None = None,
    telemetry: Telemetry | None = None,
) -> Gateway:
    """Build every component of the gateway from ``settings`` (no store or socket is opened).

    Sections are checked in this order, the first problem raised: ``policy`` (and each
    replica's destination), ``keystore``, ``telemetry``, TLS files, ``preflight`` key files,
    ``audit``, ``quotas``.

    Args:
        settings: The validated configuration.
        base: Directory of the config file (relative ``policy.file``).
        egress: The started process guard (``gateway serve``: :func:`gateway.egress.
            start_egress`); without it the policy is only loaded and checked.
        telemetry: Use this telemetry instead of the one of ``settings.telemetry`` (tests:
            one with an in-memory span exporter).

    Returns:
        The assembled gateway.

    Raises:
        ConfigError: The first invalid section, naming the key.
    """
    from gateway.audit.observer import checked_build
    from gateway.config.tls_files import check_tls_files
    from gateway.egress import load_policy, wire_egress
    from gateway.identity.build import wrap_identity
    from gateway.preflight.files import check_preflight_files
    from gateway.quotas.tool_calls import ToolCallQuotas
    from gateway.quotas.wiring import build_authenticator, build_quota_hook
    from gateway.telemetry import check_telemetry
    from policy import EgressMatcher

    policy = egress.policy if egress is not None else load_policy(settings, base)
    if policy is not None and policy.pii is not None:
        policy.pii.load()  # the sensitive-data detector, once, before serving (gateway.pii.request)
    authenticator = wrap_identity(settings, build_authenticator(settings),  # gateway.identity
                                  policy=policy, resources=_mcp_resources(settings))
    telemetry_settings = check_telemetry(settings, policy)
    check_tls_files(settings)
    check_preflight_files(settings.preflight)
    audit = checked_build(settings)  # reads the key files; the store opens in the lifespan
    quotas = build_quota_hook(settings, on_event=audit.record_event if audit is not None else None)

    router = Router(settings)
    flow = build_flow(settings, router)
    if telemetry is None and telemetry_settings is not None:
        # The service (the OpenTelemetry SDK, requests, the admin server) only with telemetry.
        from gateway.telemetry import Telemetry

        telemetry = Telemetry(
            telemetry_settings,
            policy=policy,
            egress_counts=egress.events.snapshot if egress is not None else None,
        )
    mcp: McpEndpoint | None = None
    if settings.mcp is not None:
        # Imported only with an ``mcp:`` section: its schema validation (jsonschema, whose
        # optional format checkers build their grammars at import) is most of the import cost
        # of every ``serve`` and ``check-config`` otherwise.
        from gateway.mcp.wiring import build_mcp

        mcp = build_mcp(settings.mcp, policy, egress.matcher if egress is not None else None,
                        audit.record_event if audit is not None else None,
                        telemetry.mcp_spans if telemetry is not None else None,
                        ToolCallQuotas(quotas) if quotas is not None else None,
                        audit.mcp_refused if audit is not None else None,
                        audit.mcp_catalogue if audit is not None else None)
    route_policy: RoutePolicy = AllowAll()
    connector_factory = None
    dialer: Dialer | None = None
    middlewares: list[ClientMiddlewareType] = []
    observer = telemetry.observer if telemetry is not None else None
    if telemetry is not None:
        telemetry.bind(router)
        if audit is not None:
            telemetry.watch_audit(audit.log)
        if flow is not None:
            telemetry.watch_flow(flow.queue_lengths, flow.reserve_rows)
        fetchers = list(getattr(authenticator, "fetchers", []))  # fixed until a restart
        if fetchers:
            telemetry.watch_jwks(lambda: [row for f in fetchers for row in f.outcome_rows()])
        if mcp is not None:
            from gateway.mcp.metrics import queued_rows  # with mcp: only (as build_mcp)

            gates = mcp.gates  # shared by the endpoint's live-reload copies
            telemetry.watch_mcp(mcp.metrics.call_rows, mcp.metrics.seconds_rows,
                                lambda: queued_rows(gates))
        middlewares.append(telemetry.tracer.middleware)  # outermost: client spans
    if policy is not None:
        wiring = wire_egress(
            settings,
            router,
            policy,
            egress.matcher if egress is not None else EgressMatcher(policy),
            events=egress.events if egress is not None else None,
            audit=audit.record_event if audit is not None else None,
            mode=egress.mode if egress is not None else "off",
        )
        route_policy = wiring.routes
        connector_factory = wiring.connector_factory
        dialer = wiring.dialer

    return Gateway(
        settings=settings,
        router=router,
        authenticator=authenticator,
        route_policy=route_policy,
        admission=tuple(h for h in (observer, quotas) if h is not None),
        observers=tuple(o for o in (audit, observer, quotas) if o is not None),
        connector_factory=connector_factory,
        dialer=dialer,
        upstream_middlewares=tuple(middlewares),
        policy=policy,
        egress=egress,
        audit=audit,
        quotas=quotas,
        telemetry=telemetry,
        flow=flow,
        mcp=mcp,
        pure_routes=policy is None or not policy.unsafe_allow_all,  # unsafe logs per request
    )


def reassemble(running: Gateway, settings: GatewaySettings, base: Path | None = None) -> Gateway:
    """The gateway of new ``settings`` for a live reload, keeping what lives across reloads.

    Rebuilt from ``settings``: the config keys (the managed key cache is kept), the router
    (unchanged models keep their pool, see :class:`~gateway.routing.Router`), the egress
    policy's routing decisions (a new policy revision) with the replicas' regions. Kept from
    ``running``: the audit log, quotas, telemetry (the app rebinds it to the new router when it
    swaps), the upstream transport, the egress guard and its event forwarder. Nothing is opened
    or started and ``running`` is not changed, so a refused reload leaves it serving. The
    sections that cannot change live are refused before this is called
    (:func:`gateway.serving.reload.restart_only_changes`).

    Args:
        running: The gateway being served.
        settings: The new configuration (validated by :func:`gateway.config.loader.load`).
        base: Directory of the config file (relative ``policy.file``).

    Returns:
        The new gateway (same lifespan components as ``running``: nothing to start).

    Raises:
        ConfigError: The new policy is invalid or the config does not bind to it (naming the
            key), or its destinations differ from the running policy's (code
            ``restart_required``: the guard and the transport check addresses against the
            destinations loaded at start), or it adds the first ``litellm`` replica (code
            ``restart_required``: litellm is imported at start, under the egress guard).
    """
    from gateway.egress import load_policy, wire_egress
    from gateway.errors import ConfigError
    from gateway.identity.build import wrap_identity
    from gateway.keystore.auth import ManagedKeyAuthenticator
    from policy import EgressMatcher

    if not any(r.kind == "litellm" for m in running.settings.models for r in m.replicas):
        problems = [
            f"models[{i}].replicas[{j}].kind: litellm is imported at start only when a litellm "
            "replica is configured (with its import-time egress switched off): restart to add "
            "the first one"
            for i, m in enumerate(settings.models) for j, r in enumerate(m.replicas)
            if r.kind == "litellm"
        ]
        if problems:
            raise ConfigError("\n".join(problems), code="restart_required")
    policy = load_policy(settings, base)
    if policy is not None and policy.pii is not None:
        policy.pii.load()  # in the reload's thread, not on the event loop at the swap
    old = running.policy
    if policy is not None and old is not None and (
        policy.document.destinations != old.document.destinations
        or policy.document.unsafe_allow_all != old.document.unsafe_allow_all
    ):
        raise ConfigError(
            "policy.file: destinations: changed; the egress guard and the upstream transport "
            "check addresses against the destinations loaded at start: restart to apply",
            code="restart_required",
        )
    ring = KeyRing(settings.keys)
    authenticator: Authenticator = ring
    keys = getattr(running.authenticator, "keys", running.authenticator)  # under identity
    if isinstance(keys, ManagedKeyAuthenticator):  # keep its started cache
        authenticator = ManagedKeyAuthenticator(ring, keys.cache)
    # JWKS files read and pinned again; started jwks_uri fetchers kept
    authenticator = wrap_identity(settings, authenticator, policy=policy,
                                  running=running.authenticator,
                                  resources=_mcp_resources(settings))
    router = Router(settings, reuse=running.router)
    route_policy: RoutePolicy = AllowAll()
    if policy is not None:
        egress = running.egress
        wiring = wire_egress(  # regions and litellm clients of the new replicas
            settings, router, policy,
            egress.matcher if egress is not None else EgressMatcher(policy),
            mode=egress.mode if egress is not None else "off",
        )
        route_policy = wiring.routes
    return Gateway(
        settings=settings,
        router=router,
        authenticator=authenticator,
        route_policy=route_policy,
        admission=running.admission,
        observers=running.observers,
        connector_factory=running.connector_factory,
        dialer=running.dialer,
        upstream_middlewares=running.upstream_middlewares,
        policy=policy,
        egress=running.egress,
        audit=running.audit,
        quotas=running.quotas,
        telemetry=running.telemetry,
        pure_routes=policy is None or not policy.unsafe_allow_all,
        flow=running.flow,  # rebound to the new router when the app swaps
        # mcp: itself is restart-only; a new policy revision applies to its calls too.
        mcp=running.mcp.rebound(policy) if running.mcp is not None else None,
    )


def build_flow(settings: GatewaySettings, router: Router) -> FlowGate | None:
    """Flow control over ``router`` when ``flow_control.enabled`` (else ``None``)."""
    if not settings.flow_control.enabled:
        return None
    from gateway.flow.gate import FlowGate

    return FlowGate(settings.flow_control, router, stale_s=settings.routing.metrics_stale_s)


def _mcp_resources(settings: GatewaySettings) -> dict[str, Any] | None:
    """The MCP endpoints' token audience bindings (RFC 8707, :mod:`gateway.mcp.oauth`);
    ``gateway.mcp`` is imported only with an ``mcp:`` section, as :func:`build_mcp` is."""
    if settings.mcp is None:
        return None
    from gateway.mcp.oauth import resource_bindings

    return dict(resource_bindings(settings.mcp))
