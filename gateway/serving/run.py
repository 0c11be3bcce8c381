"""Serving one gateway process: the runtime behind ``gateway serve`` (and each of its workers).

:func:`run` installs the process egress guard, assembles the gateway, wires live reload, the
drain, the admin status and the continuous pre-flight, and runs the gateway's own HTTP server
(:mod:`gateway.serving.server`) until a signal stops it. The command line
(:mod:`gateway.cli.serve`) only parses and calls it; a worker of ``--workers N``
(:mod:`gateway.serving.worker`) calls it too.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gateway.config.errors import InvalidConfig
from gateway.config.settings import GatewaySettings
from gateway.errors import ConfigError
from gateway.logs import configure_logging
from gateway.serving.settings import is_loopback_host

if TYPE_CHECKING:
    from gateway.assembly import Gateway
    from gateway.egress import EgressRuntime
    from gateway.preflight.continuous import ContinuousPreflight
    from gateway.serving.reload import Reloader

__all__ = ["ListenOverrides", "WorkerSide", "run"]


class WorkerSide(Protocol):
    """What :func:`run` uses of a worker of ``gateway serve --workers N``
    (:class:`gateway.serving.worker.WorkerSide` has it)."""

    @property
    def listener(self) -> socket.socket:
        """The supervisor's listening socket (inherited)."""
        ...

    @property
    def admin_path(self) -> str | None:
        """Unix socket for the worker's admin routes (``None`` without telemetry)."""
        ...

    def settings_for(self, settings: GatewaySettings) -> GatewaySettings:
        """``settings`` as this worker serves them (its replica id and shares)."""
        ...

    def started(self) -> None:
        """Tell the supervisor that the worker serves."""
        ...

    def applied(self, settings: GatewaySettings) -> None:
        """Tell the supervisor that a reload of ``settings`` (as loaded) was applied."""
        ...

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ListenOverrides:
    """The command line's ``--host``/``--port``, applied to the loaded configuration and to
    every configuration a live reload loads (picklable: a worker process gets it too).

    Attributes:
        host: Replaces ``listen.host`` (``None``: keep).
        port: Replaces ``listen.port`` (``None``: keep).
    """

    host: str | None = None
    port: int | None = None

    def __call__(self, settings: GatewaySettings) -> GatewaySettings:
        """``settings`` with the overrides applied (the same object when there are none)."""
        if self.host is None and self.port is None:
            return settings
        listen = settings.listen.model_copy(
            update={k: v for k, v in (("host", self.host), ("port", self.port)) if v is not None}
        )
        return settings.model_copy(update={"listen": listen})


def _unchanged(settings: GatewaySettings) -> GatewaySettings:
    return settings


@dataclass
class _ForWorker:
    adjust: Callable[[GatewaySettings], GatewaySettings]
    worker: WorkerSide
    loaded: GatewaySettings | None = None  # the last one loaded, before the worker's changes

    def __call__(self, settings: GatewaySettings) -> GatewaySettings:
        self.loaded = self.adjust(settings)
        return self.worker.settings_for(self.loaded)

    def applied(self) -> None:
        """A reload of the configuration :attr:`loaded` last was applied: tell the supervisor."""
        if self.loaded is not None:
            self.worker.applied(self.loaded)


def run(
    settings: GatewaySettings,
    base: Path | None = None,
    *,
    config: Path | None = None,
    adjust: Callable[[GatewaySettings], GatewaySettings] | None = None,
    worker: WorkerSide | None = None,
) -> int | None:
    """Serve ``settings`` until interrupted (standard asyncio loop, never uvloop).

    With a ``policy:`` section the policy is loaded and checked and the process egress guard
    installed and self-tested *before* the server starts (see :mod:`gateway.egress`). The guard
    relies on ``sys.addaudithook`` socket events, which uvloop does not raise; hence
    the standard asyncio loop. The HTTP server is the gateway's own (:mod:`gateway.serving.server`,
    :mod:`gateway.h1.server`): strict request framing, a timer on every connection state and a
    connection cap.

    Args:
        settings: The validated configuration.
        base: Directory of the config file (relative ``policy.file``).
        config: The config file: SIGHUP (and, with ``reload.watch``, a change of its files)
            reloads it live (:mod:`gateway.serving.reload`). ``None``: no live reload.
        adjust: The command line's overrides, applied to each reloaded configuration too.
        worker: Run as a worker of ``gateway serve --workers N`` (see
            :mod:`gateway.serving.worker`): serve the supervisor's socket, audit under the
            worker's replica id, admin routes on the worker's Unix socket.

    Returns:
        The signal that stopped the server after its drain (``signal.SIGTERM`` or
        ``signal.SIGINT``), or None.

    Raises:
        ConfigError: Invalid policy, replica outside its destination, guard self-test failed,
            or any other section or TLS file invalid (see :func:`gateway.assembly.assemble`).
    """
    # Imported here so that `gateway keys` / `check-config` start fast.
    from gateway.app import create_app, direct_routes
    from gateway.assembly import assemble
    from gateway.egress import start_egress
    from gateway.identity.build import client_cert_context
    from gateway.serving.drain import Drain
    from gateway.serving.server import ServerConfig, run_server, server_limits

    adjust = adjust or _unchanged
    for_worker = None
    if worker is not None:
        settings = worker.settings_for(settings)
        adjust = for_worker = _ForWorker(adjust, worker)  # a reload gets them as well
    configure_logging(settings.logging)
    egress = start_egress(settings, base)  # the process guard, before any other import
    if any(r.kind == "litellm" for m in settings.models for r in m.replicas):
        # Only when configured, and after the guard: its import-time egress is switched off.
        from policy import import_litellm

        import_litellm()
    try:
        gateway = assemble(settings, base, egress=egress)
    except ConfigError as exc:  # located in the file as check-config reports it
        raise InvalidConfig(settings.problems_of(exc)) from exc
    set_status = None
    if gateway.telemetry is not None:
        from gateway.preflight.status import gateway_status

        # GET /status on the admin port: what `gateway preflight` reads from a running gateway.
        admin = gateway.telemetry.admin
        live = _continuous_preflight(settings, egress, gateway)
        if live is not None:
            gateway = dataclasses.replace(gateway, background=(live,))
        shown_status = live.status_with_results if live is not None else (lambda s: s)
        admin.set_status(shown_status(gateway_status(settings, egress)))
        if worker is not None and worker.admin_path is not None:
            admin.listen_unix(worker.admin_path)

        def set_status(new: Gateway) -> None:
            source = gateway_status(new.settings, egress, new.policy)
            if live is not None:
                live.rebind(new.settings, new.policy, source)
            admin.set_status(shown_status(source))

    def on_applied(new: Gateway) -> None:  # a live reload: report what serves now
        if set_status is not None:
            set_status(new)
        if for_worker is not None:
            for_worker.applied()  # a restarted worker starts from it
    drain = Drain(settings.drain)  # SIGTERM: readyz 503, then drain (gateway.serving.drain)
    reloader = None
    if config is not None:
        from gateway.serving.reload import Reloader

        reloader = Reloader(config, gateway, environ=os.environ, adjust=adjust,
                            on_applied=on_applied)
    app = create_app(settings, gateway, drain=drain, reloader=reloader)
    if worker is None and not is_loopback_host(settings.listen.host):
        _log.info("listening on %s:%s", settings.listen.host, settings.listen.port)
    return run_server(
        ServerConfig(
            app,
            limits=server_limits(settings.limits),
            on_refused=gateway.audit.http_refused if gateway.audit is not None else None,
            on_evicted=gateway.audit.http_evicted if gateway.audit is not None else None,
            body_limit=(_body_limit(reloader) if reloader is not None
                        else _fixed(settings.limits.max_body_bytes)),
            host=settings.listen.host,
            port=settings.listen.port,
            ssl_certfile=settings.listen.tls_cert_file,
            ssl_keyfile=settings.listen.tls_key_file,
            ssl_context=client_cert_context(settings),  # gateway.identity: mTLS workloads
            routes=direct_routes(),
        ),
        drain,
        reloader,
        sockets=[worker.listener] if worker is not None else None,
        on_started=worker.started if worker is not None else None,
    )


def _continuous_preflight(settings: GatewaySettings, egress: EgressRuntime | None,
                          gateway: Gateway) -> ContinuousPreflight | None:
    """The continuous pre-flight of a ``preflight:`` section (needs the admin port)."""
    section = settings.preflight
    if section is None or not section.enabled or gateway.telemetry is None:
        return None
    from gateway.preflight.continuous import ContinuousPreflight
    from gateway.preflight.status import gateway_status

    replica = settings.audit.replica_id if settings.audit is not None else "gateway"
    live = ContinuousPreflight(section, settings, gateway.policy,
                               gateway_status(settings, egress), replica=str(replica))
    gateway.telemetry.registry.register(live.collector())
    return live


def _fixed(max_body_bytes: int) -> Callable[[], int]:
    """``limits.max_body_bytes`` without live reload."""
    return lambda: max_body_bytes


def _body_limit(reloader: Reloader) -> Callable[[], int]:
    """``limits.max_body_bytes`` of the configuration serving now (a live reload changes it)."""
    return lambda: reloader.running.settings.limits.max_body_bytes
