"""The app factory: :func:`create_app` builds the gateway's ASGI application.

Relay paths (``POST /v1/chat/completions`` and the others in
:data:`gateway.relay.pipeline.RELAY_PATHS`)
are dispatched by path *before* FastAPI's middleware and router, straight into the raw-ASGI
handler of :mod:`gateway.relay.pipeline` (the hot path: no per-request framework objects); so are
the
keyed ``/v1/models`` endpoints (:mod:`gateway.models_api`), which are observed (audited) like
relay requests. Everything else (``/healthz``, ``/readyz``, unknown paths) is ordinary FastAPI.
Before any of them, a request with ambiguous framing (``Content-Length`` with
``Transfer-Encoding``, repeated framing headers) is refused with 400 ``invalid_framing`` and
``Connection: close`` (second layer behind the parser check of :mod:`gateway.h1.framing`;
:func:`gateway.h1.asgi_io.scope_framing_problem`).

Everything the app needs is passed to the constructor: the settings and the assembled
components (:class:`gateway.assembly.Gateway`: authenticator, routing policy, observers such as
the audit log, admission hooks such as quotas, the upstream transport). Components may define
``async startup()`` and ``async shutdown()``; the lifespan awaits them in the order of
:meth:`Gateway.lifespan_components`.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from aiohttp.client_middlewares import ClientMiddlewareType
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway import mcp, models_api, usage_api
from gateway.access import REFUSAL_REASON, AccessLog, AccessLogMiddleware
from gateway.assembly import Gateway
from gateway.auth import Authenticator
from gateway.batch.api import RUNNER_KEY, batch_routes
from gateway.batch.runner import open_runner
from gateway.config.settings import GatewaySettings
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    PathNotFound,
    error_body,
)
from gateway.fleet.kv_subscriber import KVEventsFeed
from gateway.fleet.replica_metrics import MetricsScraper
from gateway.h1 import Dialer, RelayClient, resolver_dialer
from gateway.h1.asgi_io import escaped_api_path, framing_refusal, scope_framing_problem
from gateway.health import HealthProber
from gateway.models_api import is_models_path
from gateway.pii.request import pii_stage
from gateway.relay import pipeline as relay
from gateway.relay.records import AdmissionHook, RequestObserver
from gateway.relay.upstream import ConnectorFactory, new_session, tls_context
from gateway.routing import ClassifyingPolicy, RoutePolicy, Router
from gateway.serving.drain import Drain
from gateway.state import STATE_KEY, GatewayState, LiveState, gateway_state
from policy import denied_address_socket_factory

if TYPE_CHECKING:
    from gateway.flow.peers import FlowPeers
    from gateway.serving.reload import Reloader

__all__ = ["create_app", "direct_routes"]

_log = logging.getLogger(__name__)


class _GatewayApp(FastAPI):
    """FastAPI with a path dispatch in front for the relay hot path and ``/v1/models``."""

    created: int = 0
    """Unix time in seconds reported as every model's ``created`` (set by create_app)."""
    mcp: bool = False
    """An MCP endpoint (``/mcp/<name>``, RFC 9728 metadata) is configured (set by create_app)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path in relay.RELAY_PATHS:
                await relay.serve(scope, receive, send)  # its own framing and path checks
                return
            problem = scope_framing_problem(scope["headers"])
            if problem is not None:
                # Second layer behind gateway.h1.framing's parser check (any ASGI server):
                # answer and let the server close, so a smuggled request is never read.
                for message in framing_refusal(problem):
                    await send(message)
                return
            if escaped_api_path(scope):
                await _send_error(send, PathNotFound("Not Found"))
                return
            if is_models_path(path):
                await models_api.handle(gateway_state(scope), scope, receive, send, self.created)
                return
            if self.mcp and (path.startswith(mcp.PREFIX) or path == mcp.AGGREGATE
                             or path.startswith(mcp.WELL_KNOWN)):
                state = gateway_state(scope)
                assert state.mcp is not None  # mcp: is restart-only
                if not path.startswith(mcp.WELL_KNOWN):
                    await state.mcp.handle(state, scope, receive, send)
                else:
                    await state.mcp.handle_metadata(scope, send)
                return
        elif scope["type"] == "lifespan":
            send = _startup_failure_in_one_line(send)
        await super().__call__(scope, receive, send)


def direct_routes() -> dict[str, Any]:
    """The paths the gateway's own server hands straight to their handler, skipping the app's
    dispatch: each relay path to :func:`gateway.relay.pipeline.serve` (which makes the app's
    framing and path checks itself). Give it to ``ServerConfig.routes``; the app still serves
    every other path and runs the lifespan, and serves these paths too under another server.

    Returns:
        Request path -> ASGI callable.
    """
    return dict.fromkeys(relay.RELAY_PATHS, relay.serve)


async def _send_error(send: Any, exc: GatewayError) -> None:
    """Answer ``exc`` as OpenAI-style JSON with raw ASGI messages."""
    body = error_body(exc)
    await send({"type": "http.response.start", "status": exc.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def _startup_failure_in_one_line(send: Any) -> Any:
    """``send`` for the lifespan: a start-up failure of one of our packages' errors (anything
    with a string ``code``: an unreachable audit store, a policy file) is reported as its one
    line ``Type: message``, not the traceback Starlette formats, which the server would log as
    the reason; the traceback goes to the debug log. Other exceptions (bugs) keep it."""

    async def wrapped(message: Any) -> None:
        if message.get("type") == "lifespan.startup.failed":
            exc = sys.exc_info()[1]  # Starlette sends this from its ``except`` block
            if exc is not None and isinstance(getattr(exc, "code", None), str):
                _log.debug("start-up failed", exc_info=exc)
                message = {**message, "message": f"{type(exc).__name__}: {exc}"}
        await send(message)

    return wrapped


def _error_response(exc: GatewayError) -> JSONResponse:
    return JSONResponse(exc.to_dict(), status_code=exc.status, headers=exc.headers)


def _request_parts(parts: Gateway, settings: GatewaySettings) -> dict[str, Any]:
    """The fields of :class:`GatewayState` that a live reload replaces."""
    policy = parts.route_policy
    classifying = policy if isinstance(policy, ClassifyingPolicy) else None
    return {
        "settings": settings,
        "router": parts.router,
        "authenticator": parts.authenticator,
        "policy": policy,
        "forward_headers": frozenset(h.encode() for h in settings.limits.forward_headers),
        "class_header": (
            classifying.classification_header.encode("latin-1") if classifying else None
        ),
        "classify": classifying.classify if classifying else None,
        "routes": parts.routes,
        "refuse_redirects": parts.policy is not None,
        "pii": pii_stage(parts.policy),
        "mcp": parts.mcp,
    }


def create_app(
    settings: GatewaySettings,
    gateway: Gateway | None = None,
    *,
    connector_factory: ConnectorFactory | None = None,
    dialer: Dialer | None = None,
    policy: RoutePolicy | None = None,
    observers: Sequence[RequestObserver] = (),
    admission: Sequence[AdmissionHook] = (),
    authenticator: Authenticator | None = None,
    router: Router | None = None,
    upstream_middlewares: Sequence[ClientMiddlewareType] = (),
    drain: Drain | None = None,
    reloader: Reloader | None = None,
) -> FastAPI:
    """Build the gateway app from its assembled components.

    Either pass ``gateway`` (from :func:`gateway.assembly.assemble`, as ``gateway serve``
    does), or the parts by keyword (tests, embedding; see :meth:`Gateway.of` for defaults).

    Args:
        settings: The validated configuration.
        gateway: The assembled components (then no other keyword may be given).
        connector_factory: Builds the aiohttp connector for upstream connections (the egress
            policy's checked connector); default a plain pooled ``TCPConnector``. It serves
            the health prober and the metrics scraper.
        dialer: Opens the relay's own upstream connections (:func:`gateway.h1.resolver_dialer`
            with the egress policy's resolver and socket factory); default the system
            resolver. Give it with ``connector_factory`` built from the same resolver.
        policy: Per-request routing decision (default: every replica allowed).
        observers: Request observers (audit log, telemetry), see :mod:`gateway.relay.records`.
        admission: Admission hooks run before forwarding (quotas).
        authenticator: Key lookup (default: the ``keys`` of the config file).
        router: Replica pools (default: built from ``settings``; pass one to inspect it).
        upstream_middlewares: aiohttp client middlewares of the upstream session, outermost
            first (telemetry client spans, ``policy.policy_middleware``).
        drain: Drain state of ``gateway serve``: ``/readyz`` answers 503 while draining, and
            relay requests are tracked so the drain deadline can end them.
        reloader: Live reload of ``gateway serve`` (:mod:`gateway.serving.reload`): the lifespan
        hands
            it the function that swaps in a reassembled gateway (new requests get the new
            snapshot; the health prober, metrics scraper and telemetry follow the new router).

    Returns:
        The ASGI app (run it with lifespan on, standard asyncio loop).

    Raises:
        TypeError: Both ``gateway`` and separate parts were given.
    """
    if gateway is None:
        gateway = Gateway.of(
            settings, router=router, authenticator=authenticator, route_policy=policy,
            admission=admission, observers=observers, connector_factory=connector_factory,
            dialer=dialer,
            upstream_middlewares=upstream_middlewares,
        )
    elif (connector_factory or dialer or policy or observers or admission or authenticator or router
          or upstream_middlewares):
        raise TypeError("create_app: pass either an assembled gateway or its parts, not both")
    parts = gateway
    created = int(time.time())
    the_router = parts.router
    upstream_ssl = tls_context(settings.upstream_tls)  # fails at start, not per request
    # One for the app's life: its refusal counts outlive a reload.
    access = AccessLog(settings.logging.refused_interval_s,
                       settings.logging.refused_lines_per_client)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, Any]]:
        session = new_session(settings, parts.connector_factory, parts.upstream_middlewares)
        upstream = RelayClient(
            parts.dialer or resolver_dialer(socket_factory=denied_address_socket_factory()),
            tls=upstream_ssl,
            limit=settings.limits.max_upstream_connections,
            keep_alive_s=settings.timeouts.upstream_keep_alive_s,
            connect_s=settings.timeouts.connect_s, observers=parts.attempt_observers,
        )
        state = GatewayState(
            session=session,
            hooks=parts.hooks,
            upstream=upstream,
            upstream_ssl=upstream_ssl,
            drain=drain,
            access=access,
            **_request_parts(parts, settings),
            flow=parts.flow,
        )
        cell = LiveState(state)
        # The Batch API (gateway.batch), or None; its events go to the audit log.
        batches = open_runner(settings, cell,
                              parts.audit.record_event if parts.audit is not None else None)
        connect_s = settings.timeouts.connect_s
        prober = HealthProber(the_router, session, settings.health, upstream_ssl,
                              connect_s=connect_s)
        scraper = MetricsScraper(the_router, session, settings.routing, upstream_ssl,
                                 on_round=parts.flow.kick_all if parts.flow else None,
                                 connect_s=connect_s)
        # KV-cache events of the replicas (routing.kv_events; not reloadable: the sockets
        # follow the start-up configuration, the indexes follow reloaded pools).
        kv_feed = KVEventsFeed(the_router, settings.routing.kv_events)
        shared = settings.flow_control.shared if settings.flow_control.enabled else None
        peers: FlowPeers | None = None
        if shared is not None:
            # Imported only with flow_control.shared: the Redis client is a tenth of the
            # import time of every other ``gateway serve``.
            from gateway.flow.peers import FlowPeers

            peers = FlowPeers(the_router, shared,
                              on_round=parts.flow.kick_all if parts.flow else None,
                              shares=parts.flow.shares if parts.flow else None,
                              clock=parts.flow.clock if parts.flow else time.monotonic)

        def swap(new: Gateway) -> None:
            # One step on the event loop: requests already running keep their snapshot.
            cell.current = dataclasses.replace(cell.current, **_request_parts(new, new.settings))
            # timeouts.connect_s is reloadable: the relay reads it per dial, the prober and
            # the scraper per request (the session's own timeout is fixed at start).
            connect_s = new.settings.timeouts.connect_s
            upstream.connect_s = connect_s
            prober.rebind(new.router, connect_s)
            scraper.rebind(new.router, connect_s)
            kv_feed.rebind(new.router)
            if peers is not None:
                peers.rebind(new.router)
            if new.flow is not None:
                new.flow.reconfigure(new.settings.flow_control)
                new.flow.rebind(new.router)
            if new.telemetry is not None:
                new.telemetry.bind(new.router)
            if new.quotas is not None and new.settings.quotas is not None:
                new.quotas.reconfigure(new.settings.quotas)
            if scraper.needed and not scraper.running:
                scraper.start()
        started: list[Any] = []
        try:
            for hook in parts.lifespan_components():
                startup = getattr(hook, "startup", None)
                if startup is not None:
                    await startup()
                started.append(hook)
            if settings.health.active:
                prober.start()
            if scraper.needed:
                scraper.start()
            kv_feed.start()
            if peers is not None:
                peers.start()
            if reloader is not None:
                reloader.attach(swap)
            if batches is not None:
                await batches.startup()  # resumes the batches a previous run left
            yield {STATE_KEY: cell, RUNNER_KEY: batches}
        finally:
            if batches is not None:
                await batches.shutdown()
            if reloader is not None:
                await reloader.detach()
            await scraper.stop()
            await kv_feed.stop()
            if peers is not None:
                await peers.stop()
            await prober.stop()
            for hook in reversed(started):
                shutdown = getattr(hook, "shutdown", None)
                if shutdown is not None:
                    await shutdown()
            await upstream.close()
            await session.close()
            access.flush()  # the summaries of the refusals counted in the last interval

    app = _GatewayApp(
        title="sovereign-gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.created = created
    if settings.batch is not None and settings.batch.enabled:
        app.router.routes.extend(batch_routes())
    app.mcp = parts.mcp is not None
    app.add_middleware(AccessLogMiddleware, log=settings.logging.access_log, access=access)

    audit = parts.audit

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        if exc.status == 401 or exc.reason == "ambiguous_credentials":
            # No caller: counted in the audit log as on the relay, its access line bounded.
            request.scope[REFUSAL_REASON] = exc.reason or exc.code
            if audit is not None:
                client = request.scope.get("client")
                audit.request_refused(exc.status, exc.code,
                                      getattr(request.scope.get("route"), "path", "other"),
                                      client[0] if client else None, exc.reason)
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The router's refusal (no such path or method), before any caller is known: anyone's
        # to send, so its access line is bounded (the routes raise GatewayErrors).
        request.scope[REFUSAL_REASON] = {404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, f"status_{exc.status_code}")
        if exc.status_code == 405:
            return _error_response(MethodNotAllowed(f"Method not allowed on {request.url.path}."))
        err = GatewayError(str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        err.status = exc.status_code
        err.type = "invalid_request_error"
        return _error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(InvalidRequest(str(exc.errors()[:1])))

    @app.get(usage_api.USAGE_PATH)
    async def usage(request: Request) -> JSONResponse:
        """The caller's own consumption and remaining budget (:mod:`gateway.usage_api`)."""
        return JSONResponse(await usage_api.usage(gateway_state(request), parts.quotas,
                                                  request.scope))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process is up and serving."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        """Readiness: every model has at least one available replica, and not draining.

        Unauthenticated (load balancers and kubelets probe it), so it says only the overall
        state: ``{"status": "ready"}`` (200), ``"not_ready"`` or ``"draining"`` (503). Model
        names and replica counts are not listed (``/v1/models`` shows a key only its own
        models); the per-model, per-replica state is on the admin port's ``/metrics``
        (``sg_gateway_replica_healthy``).
        """
        if drain is not None and drain.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        missing = gateway_state(request).router.not_ready()
        return JSONResponse({"status": "not_ready" if missing else "ready"},
                            status_code=503 if missing else 200)

    return app
