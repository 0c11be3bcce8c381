"""Wiring of the egress policy (``policy`` package) into the gateway.

The gateway config names the policy file (``policy: {file: PATH, guard: enforce|monitor|off}``),
every replica names its destination (``replicas[].destination``) and every key has a ``team`` and
a default ``data_class``. At start-up :func:`start_egress`:

1. loads the policy and checks that every replica URL lies inside the destination it names
   (``policy.check_binding``) and that every key's default class is defined;
2. installs the process guard (default ``enforce``) and runs its self-test, refusing to start if a
   denied connection is not blocked (uvloop, broken hook).

:func:`wire_egress` (called by :func:`gateway.assembly.assemble`) then makes sure that

* routing only offers replicas whose destination the policy allows for the request's key, team
  and data class (:class:`PolicyRoutes`, the gateway's ``RoutePolicy`` seam, decided at
  assembly into the route table); the ``x-data-classification`` header changes the class only
  where a grant allows it;
* every upstream connection (relay and health checks) goes through the policy-checked connector,
  which checks each address when it connects (``policy.checked_socket_factory``: address
  literals and pinned addresses alike) and shares the guard's pins; the upstream session never
  uses a proxy (``trust_env`` off) and never follows a redirect (the relay refuses one with
  ``redirect_refused``, :func:`policy.redirect_refused`). The check is made per connection,
  not per request: a pooled connection was checked when it was opened;
* guard events are counted and recorded as ``egress.denied`` audit events when the audit log is
  on (:class:`gateway.egress_events.EgressEvents`; and ``policy.loaded`` once at start-up).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gateway.auth import Principal
from gateway.config.settings import GatewaySettings
from gateway.egress_events import AuditSink, EgressEvents
from gateway.egress_settings import PolicySettings
from gateway.errors import ClassChangeRefused, ConfigError, InvalidRequest
from gateway.fleet.model_settings import ModelSettings
from gateway.h1 import Dialer, resolver_dialer
from gateway.routing import Replica, RouteDecision, Router
from policy import (
    ClassChangeForbidden,
    EgressGuard,
    EgressMatcher,
    Policy,
    PolicyError,
    PolicyResolver,
    UnknownDataClass,
    check_binding,
    checked_socket_factory,
    make_connector,
    start_guard,
)
from policy import Principal as PolicyPrincipal

__all__ = [
    "EgressRuntime",
    "EgressWiring",
    "PolicyRoutes",
    "PolicySettings",
    "binding_problems",
    "load_policy",
    "policy_settings",
    "start_egress",
    "wire_egress",
]

_log = logging.getLogger(__name__)

def policy_settings(settings: GatewaySettings, base: Path | None = None) -> PolicySettings | None:
    """The ``policy:`` section (``None`` when absent); validated and its ``file`` resolved
    against the config file's directory by :func:`gateway.config.loader.load`.

    Args:
        settings: The gateway settings (a mapping in ``settings.policy`` is validated here).
        base: Directory a still relative ``file`` is resolved against (settings built without
            :func:`gateway.config.loader.parse`).

    Raises:
        pydantic.ValidationError: ``settings.policy`` is a mapping that is not a valid section.
    """
    section: Any = settings.policy
    if section is None:
        return None
    ps = section if isinstance(section, PolicySettings) else (
        PolicySettings.model_validate(section))
    if not ps.file.is_absolute() and base is not None:
        ps = ps.model_copy(update={"file": base / ps.file})
    return ps


def binding_problems(policy: Policy,
                     bindings: Iterable[tuple[str, str, str | None]]) -> list[str]:
    """Check that each URL lies in the destination it names (:func:`policy.check_binding`).

    Args:
        policy: The loaded policy.
        bindings: ``(config key path, URL, destination id or None)`` per replica or server.

    Returns:
        One ``"<key path>: <problem>"`` line per binding that fails (a missing destination
        included), in the given order; empty when all hold.
    """
    problems: list[str] = []
    for where, url, destination in bindings:
        if destination is None:
            problems.append(f"{where}: required when a policy is configured")
            continue
        try:
            check_binding(policy, url, destination)
        except PolicyError as exc:
            problems.append(f"{where}: {exc.message}")
    return problems


def load_policy(settings: GatewaySettings, base: Path | None = None) -> Policy | None:
    """Load the policy the config names and check the config against it.

    Checks: every replica has a destination of purpose ``inference`` and its URL lies inside
    it; every key's default ``data_class`` is a class of the policy.

    Returns:
        The policy, or ``None`` when the config has no ``policy:`` section.

    Raises:
        ConfigError: Unreadable/invalid policy file (``file:line: key: ...``), a replica without
            or outside its destination or at one not of purpose ``inference``, or an undefined
            key class (the message names the key).
    """
    ps = policy_settings(settings, base)
    if ps is None:
        return None
    try:
        pol = Policy.from_file(ps.file)
    except PolicyError as exc:
        # One line per problem of the policy file (PolicyFileError has one per line).
        lines = exc.message.splitlines() or [exc.message]
        raise ConfigError("\n".join(f"policy.file: {line}" for line in lines),
                          code=exc.code) from exc
    problems = binding_problems(pol, (
        (f"models[{i}].replicas[{j}].destination", replica.url, replica.destination)
        for i, model in enumerate(settings.models) for j, replica in enumerate(model.replicas)))
    # The rules cannot tell a prompt from a tool call: a replica at a tool (or telemetry)
    # destination would get prompts under a rule written for tool calls.
    for i, model in enumerate(settings.models):
        for j, replica in enumerate(model.replicas):
            dest = pol.destinations.get(replica.destination or "")
            if dest is not None and dest.purpose != "inference":
                problems.append(
                    f"models[{i}].replicas[{j}].destination: destination {dest.id!r} has "
                    f"purpose {dest.purpose!r}; a model replica needs one of purpose "
                    "'inference'")
    for i, key in enumerate(settings.keys):
        if key.data_class not in pol.classes:
            problems.append(
                f"keys[{i}].data_class: {key.data_class!r} is not a data class of the policy "
                f"({', '.join(pol.classes)})"
            )
    if problems:
        raise ConfigError("\n".join(problems), code="destination_mismatch")
    return pol


@dataclasses.dataclass(slots=True)
class EgressRuntime:
    """What :func:`start_egress` set up for one gateway process.

    Attributes:
        policy: The loaded policy.
        mode: Guard mode.
        guard: The installed guard (``None`` with ``guard: off``).
        matcher: Address checks shared by the transport and the guard (one pin store).
        events: Guard event counter and audit forwarder.
    """

    policy: Policy
    mode: str
    guard: EgressGuard | None
    matcher: EgressMatcher
    events: EgressEvents


def start_egress(
    settings: GatewaySettings,
    base: Path | None = None,
    *,
    self_test_target: tuple[str, int] | None = None,
) -> EgressRuntime | None:
    """Load and check the policy, then install and self-test the process guard.

    Call before the server's event loop runs (``gateway serve`` does).

    Args:
        settings: The gateway settings.
        base: Directory of the config file (relative ``policy.file``).
        self_test_target: Address the guard self-test tries (default TEST-NET-1 port 9).

    Returns:
        The runtime, or ``None`` without a ``policy:`` section.

    Raises:
        ConfigError: Invalid policy or binding (see :func:`load_policy`), or the guard
            self-test failed (code ``guard_self_test_failed``): the gateway must not start.
    """
    ps = policy_settings(settings, base)
    pol = load_policy(settings, base)
    if ps is None or pol is None:
        return None
    events = EgressEvents()
    kwargs: dict[str, Any] = {}
    if self_test_target is not None:
        kwargs["self_test_target"] = self_test_target
    try:
        guard = start_guard(pol, ps.guard, on_event=events, **kwargs)
    except PolicyError as exc:
        raise ConfigError(
            f"egress guard did not start: {exc.message}", code="guard_self_test_failed"
        ) from exc
    if pol.unsafe_allow_all:
        _log.warning("policy %s has unsafe_allow_all on: egress is NOT restricted", pol.source)
    _log.info(
        "egress policy %s (%s) loaded, guard %s", pol.source, pol.revision, ps.guard
    )
    matcher = guard.matcher if guard is not None else EgressMatcher(pol)
    return EgressRuntime(pol, ps.guard, guard, matcher, events)


class PolicyRoutes:
    """The gateway's ``RoutePolicy``: only replicas whose destination the policy allows.

    Its decision depends only on the model's replicas and the caller's key, team and data
    class, so the assembly makes it once per configured key and model into the route table
    (:class:`gateway.routing.RouteTable`); a request asks :meth:`decide` only for a principal
    the table does not hold yet (managed keys, a class changed by the header), and every time
    under ``unsafe_allow_all`` (which logs each request).

    Args:
        policy: The policy.
        events: Lifespan-managed egress event forwarder (started/stopped with the app).
        audit: Appends admin records (``policy.loaded``) when the audit log is on.
        mode: Guard mode (recorded in ``policy.loaded``).
    """

    def __init__(
        self,
        policy: Policy,
        events: EgressEvents | None = None,
        audit: AuditSink | None = None,
        mode: str = "off",
    ) -> None:
        self.policy = policy
        self.classification_header = policy.classification_header
        self._events = events
        self._audit = audit
        self._mode = mode
        self._unsafe = policy.unsafe_allow_all

    async def startup(self) -> None:
        """Record ``policy.loaded`` and start forwarding guard events to the audit log."""
        if self._audit is not None:
            await self._audit({
                "type": "policy.loaded",
                "revision": self.policy.revision,
                "file": self.policy.source,
                "guard": self._mode,
                "unsafe_allow_all": self._unsafe,
            })
        if self._events is not None:
            self._events.sink = self._audit
            await self._events.startup()

    async def shutdown(self) -> None:
        """Flush queued guard events."""
        if self._events is not None:
            await self._events.shutdown()

    def classify(self, principal: Principal, header_value: str | None) -> Principal:
        """Resolve the request's data class (key default, changed by the header by grant).

        Raises:
            ClassChangeRefused: 403 ``class_change_forbidden``.
            InvalidRequest: 400 ``unknown_data_class``.
        """
        if header_value is None:
            return principal
        try:
            data_class = self.policy.resolve_class(
                principal.data_class, header_value,
                PolicyPrincipal(principal.key_id, principal.team),
            )
        except ClassChangeForbidden as exc:
            raise ClassChangeRefused(exc.message, param=self.classification_header) from exc
        except UnknownDataClass as exc:
            raise InvalidRequest(exc.message, code="unknown_data_class",
                                 param=self.classification_header) from exc
        if data_class == principal.data_class:
            return principal
        return dataclasses.replace(principal, data_class=data_class)

    def decide(
        self, principal: Principal, model: ModelSettings, replicas: Sequence[Replica]
    ) -> RouteDecision:
        """Allowed replicas, the deciding rule and the policy revision.

        Raises:
            InvalidRequest: 400 ``unknown_data_class`` (the key's class is not in the policy).
        """
        if self._unsafe:
            _log.warning(
                "unsafe_allow_all is on: request of key %s for %s is not restricted by the "
                "egress policy (development only)", principal.key_id, model.name,
            )
        try:
            sel = self.policy.select(
                PolicyPrincipal(principal.key_id, principal.team),
                principal.data_class,
                [r.destination for r in replicas],
            )
        except UnknownDataClass as exc:
            raise InvalidRequest(exc.message, code="unknown_data_class") from exc
        return RouteDecision(
            tuple(replicas[i] for i in sel.allowed),
            sel.rule_id,
            revision=self.policy.revision,
            reason=sel.reason or None,
            content_hmac=sel.content_hmac,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class EgressWiring:
    """The egress policy's parts of one gateway (built by :func:`wire_egress`).

    Attributes:
        routes: The routing policy seam (``RoutePolicy``) with data-class resolution.
        connector_factory: Builds the policy-checked aiohttp connector of the health prober
            and the metrics scraper (every connection checked when it is opened).
        dialer: Opens the relay's upstream connections with the same pinning resolver and
            checked socket factory.
    """

    routes: PolicyRoutes
    connector_factory: Callable[[], Any]
    dialer: Dialer


def wire_egress(
    settings: GatewaySettings,
    router: Router,
    policy: Policy,
    matcher: EgressMatcher,
    *,
    events: EgressEvents | None = None,
    audit: AuditSink | None = None,
    mode: str = "off",
) -> EgressWiring:
    """Bind the replicas of ``router`` to the policy and build the policy-checked transport.

    Sets each replica's ``region`` from its destination and gives litellm replicas the
    policy-checked httpx client.

    Args:
        settings: The gateway settings (``limits.max_upstream_connections``).
        router: The replica pools (changed in place: regions, litellm clients).
        policy: The loaded policy.
        matcher: Address checks shared with the process guard (one pin store).
        events: Guard event forwarder, started and stopped with the app (``None``: no guard).
        audit: Appends ``policy.loaded`` and ``egress.denied`` records (the audit log is on).
        mode: Guard mode, recorded in ``policy.loaded``.

    Returns:
        The routing policy, the connector factory and the relay's dialer.
    """
    for pool in router.pools.values():
        for replica in pool.replicas:
            dest = policy.destinations.get(replica.destination or "")
            replica.region = dest.region if dest is not None else None
            if replica.kind == "litellm":  # litellm gets the policy-checked httpx client
                from gateway.relay.litellm_backend import make_client

                replica.client = make_client(replica.url, replica.api_key, matcher)
    limit = settings.limits.max_upstream_connections
    return EgressWiring(
        routes=PolicyRoutes(policy, events, audit, mode),
        connector_factory=lambda: make_connector(
            matcher, limit=limit, limit_per_host=0,
            keepalive_timeout=settings.timeouts.upstream_keep_alive_s,
        ),
        dialer=resolver_dialer(PolicyResolver(matcher), checked_socket_factory(matcher)),
    )
