"""The typed run-time state of one gateway app, built in the lifespan.

Reach it only through :func:`gateway_state` (from an ASGI scope or a Starlette request): the
lifespan puts a :class:`LiveState` into the ASGI lifespan state under one key, so there is no
global and no ``app.state`` probing. A live reload (:mod:`gateway.serving.reload`) replaces the
whole
:class:`GatewayState` in that cell; a request reads the cell once, at its start, and keeps that
snapshot to its end.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from gateway.access import AccessLog
from gateway.auth import Authenticator, Principal
from gateway.config.settings import GatewaySettings
from gateway.h1 import RelayClient
from gateway.relay.records import ObserverHooks
from gateway.routing import RoutePolicy, Router, RouteTable
from gateway.serving.drain import Drain

if TYPE_CHECKING:
    from gateway.flow.gate import FlowGate
    from gateway.mcp.endpoint import McpEndpoint
    from gateway.pii.request import PiiStage

__all__ = ["STATE_KEY", "GatewayState", "LiveState", "gateway_state"]

STATE_KEY = "sovereign_gateway"

Classifier = Callable[[Principal, str | None], Principal]


@dataclass(slots=True)
class GatewayState:
    """Everything a request handler needs.

    Attributes:
        settings: The frozen configuration.
        router: Replica pools by model.
        authenticator: Key -> principal.
        policy: Per-request routing decision (egress policy seam).
        routes: The routing decisions of ``policy`` decided at assembly (the route step's
            lookup; :class:`gateway.routing.RouteTable`).
        session: The pooled aiohttp client (health probes, metrics scraping).
        hooks: The bound hooks of the observers (audit, quotas, telemetry) and admission hooks
            (telemetry, quotas), in the order the assembly gave them.
        upstream: The relay's own pooled upstream client (:mod:`gateway.h1`), dialing through
            ``session``'s connector (the egress policy's checks).
        forward_headers: Client header names (lower-case bytes) relayed upstream.
        class_header: Data-classification header (lower-case bytes) of the egress policy.
        classify: ``(principal, header value or None) -> principal`` with the request's data
            class resolved by the egress policy (raises a ``GatewayError`` to refuse).
        upstream_ssl: ``ssl`` argument of every upstream request (``True`` or a context with
            the configured CA bundle / client certificate).
        drain: The drain state of ``gateway serve`` (``None`` when not served by it).
        flow: Flow control (``None`` when ``flow_control.enabled`` is off).
        pii: The policy's sensitive-data stage (``None`` without a ``pii`` section).
        mcp: The MCP endpoint (``/mcp/<name>``), if ``mcp:`` is configured.
        refuse_redirects: An upstream redirect answer fails the request with
            ``redirect_refused`` (the egress policy is on; it is never followed either way).
        access: The access log (its refusal lines bounded per client network), kept across
            reloads.
    """

    settings: GatewaySettings
    router: Router
    authenticator: Authenticator
    policy: RoutePolicy
    session: aiohttp.ClientSession
    routes: RouteTable
    hooks: ObserverHooks = field(default_factory=ObserverHooks)
    upstream: RelayClient = field(kw_only=True)
    forward_headers: frozenset[bytes] = field(default_factory=frozenset)
    class_header: bytes | None = None
    classify: Classifier | None = None
    upstream_ssl: ssl.SSLContext | bool = True
    drain: Drain | None = None
    flow: FlowGate | None = None
    refuse_redirects: bool = False
    pii: PiiStage | None = None
    mcp: McpEndpoint | None = None
    access: AccessLog = field(default_factory=AccessLog)


class LiveState:
    """The cell the lifespan state holds: the current snapshot, replaced whole on reload.

    Attributes:
        current: The snapshot new requests take.
    """

    __slots__ = ("current",)

    def __init__(self, current: GatewayState) -> None:
        self.current = current


def gateway_state(source: Mapping[str, Any] | Any) -> GatewayState:
    """Return the current state snapshot from an ASGI ``scope`` or a Starlette ``Request``.

    Raises:
        RuntimeError: The app's lifespan did not run (the server was started without it).
    """
    scope = source if isinstance(source, Mapping) else source.scope
    try:
        cell = scope["state"][STATE_KEY]
    except (KeyError, TypeError) as exc:
        raise RuntimeError("gateway state missing: run the app with lifespan enabled") from exc
    if not isinstance(cell, LiveState):
        raise RuntimeError("gateway state has the wrong type")
    return cell.current
