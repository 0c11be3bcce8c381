"""``gateway serve --config FILE``: run the gateway in the foreground with uvicorn."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gateway.logs import configure_logging
from gateway.settings import GatewaySettings, is_loopback_host, load

if TYPE_CHECKING:
    from gateway.supervisor import WorkerSlot

__all__ = ["run", "serve"]

_log = logging.getLogger(__name__)

ConfigOpt = Annotated[
    Path,
    typer.Option("--config", "-c", envvar="SG_CONFIG", help="Gateway YAML config file."),
]


def run(settings: GatewaySettings, base: Path | None = None, *,
        worker: WorkerSlot | None = None) -> None:
    """Serve ``settings`` until interrupted (standard asyncio loop, never uvloop).

    With a ``policy:`` section the policy is loaded and checked and the process egress guard
    installed and self-tested *before* the server starts (see :mod:`gateway.egress`). The guard
    relies on ``sys.addaudithook`` socket events, which uvloop does not raise; hence
    ``loop="asyncio"``. The HTTP server is uvicorn's h11 protocol with strict request framing,
    header/idle timeouts and a connection cap (:mod:`gateway.http_guard`).

    Args:
        settings: The validated configuration.
        base: Directory of the config file (relative ``policy.file``).
        worker: Run as a worker of ``gateway serve --workers N`` (see
            :mod:`gateway.supervisor`): serve the supervisor's socket, audit under the
            worker's replica id, admin routes on the worker's Unix socket.

    Raises:
        ConfigError: Invalid policy, replica outside its destination, guard self-test failed,
            or any other section or TLS file invalid (see :func:`gateway.assembly.assemble`).
    """
    # Imported here so that `gateway keys` / `check-config` start fast.
    import uvicorn

    from gateway.app import create_app
    from gateway.assembly import assemble
    from gateway.drain import Drain
    from gateway.egress import start_egress
    from gateway.http_guard import server_options
    from gateway.server import run_server

    if worker is not None:
        settings = worker.settings_for(settings)
    configure_logging(settings.logging)
    egress = start_egress(settings, base)  # the process guard, before any other import
    if any(r.kind == "litellm" for m in settings.models for r in m.replicas):
        # Only when configured, and after the guard: its import-time egress is switched off.
        from policy import import_litellm

        import_litellm()
    gateway = assemble(settings, base, egress=egress)
    if gateway.telemetry is not None:
        from gateway.preflight.status import gateway_status

        # GET /status on the admin port: what `gateway preflight` reads from a running gateway.
        gateway.telemetry.admin.set_status(gateway_status(settings, egress))
        if worker is not None and worker.admin_path is not None:
            gateway.telemetry.admin.listen_unix(worker.admin_path)
    drain = Drain(settings.drain)  # SIGTERM: readyz 503, then drain (gateway.drain)
    app = create_app(settings, gateway, drain=drain)
    if worker is None and not is_loopback_host(settings.listen.host):
        _log.info("listening on %s:%s", settings.listen.host, settings.listen.port)
    run_server(
        uvicorn.Config(
            app,
            **server_options(
                settings.limits,
                host=settings.listen.host,
                port=settings.listen.port,
                ssl_certfile=settings.listen.tls_cert_file,
                ssl_keyfile=settings.listen.tls_key_file,
            ),
        ),
        drain,
        sockets=[worker.listener] if worker is not None else None,
        on_started=worker.started if worker is not None else None,
    )


def serve(
    config: ConfigOpt,
    host: Annotated[str | None, typer.Option(help="Override listen.host.")] = None,
    port: Annotated[int | None, typer.Option(help="Override listen.port.")] = None,
    workers: Annotated[int, typer.Option(
        min=1, envvar="SG_WORKERS",
        help="Worker processes serving the one port (the chart: the CPU limit). More than 1 "
             "needs shared quota state (quotas.backend: redis).")] = 1,
) -> None:
    """Run the gateway from one YAML config file (fails at start if the file is invalid)."""
    settings = load(config, os.environ)
    if host is not None or port is not None:
        listen = settings.listen.model_copy(
            update={k: v for k, v in (("host", host), ("port", port)) if v is not None}
        )
        settings = settings.model_copy(update={"listen": listen})
    if workers > 1:
        from gateway.supervisor import serve_workers

        raise typer.Exit(serve_workers(settings, config.parent, workers))
    run(settings, config.parent)
