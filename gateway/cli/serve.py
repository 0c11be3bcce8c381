"""``gateway serve --config FILE``: run the gateway in the foreground with uvicorn."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gateway.logs import configure_logging
from gateway.settings import GatewaySettings, is_loopback_host, load

if TYPE_CHECKING:
    from gateway.assembly import Gateway

__all__ = ["run", "serve"]

_log = logging.getLogger(__name__)

ConfigOpt = Annotated[
    Path,
    typer.Option("--config", "-c", envvar="SG_CONFIG", help="Gateway YAML config file."),
]


def run(
    settings: GatewaySettings,
    base: Path | None = None,
    *,
    config: Path | None = None,
    adjust: Callable[[GatewaySettings], GatewaySettings] | None = None,
) -> None:
    """Serve ``settings`` until interrupted (standard asyncio loop, never uvloop).

    With a ``policy:`` section the policy is loaded and checked and the process egress guard
    installed and self-tested *before* the server starts (see :mod:`gateway.egress`). The guard
    relies on ``sys.addaudithook`` socket events, which uvloop does not raise; hence
    ``loop="asyncio"``. The HTTP server is uvicorn's h11 protocol with strict request framing,
    header/idle timeouts and a connection cap (:mod:`gateway.http_guard`).

    Args:
        settings: The validated configuration.
        base: Directory of the config file (relative ``policy.file``).
        config: The config file: SIGHUP (and, with ``reload.watch``, a change of its files)
            reloads it live (:mod:`gateway.reload`). ``None``: no live reload.
        adjust: The command line's overrides, applied to each reloaded configuration too.

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

    configure_logging(settings.logging)
    egress = start_egress(settings, base)  # the process guard, before any other import
    if any(r.kind == "litellm" for m in settings.models for r in m.replicas):
        # Only when configured, and after the guard: its import-time egress is switched off.
        from policy import import_litellm

        import_litellm()
    gateway = assemble(settings, base, egress=egress)
    on_applied = None
    if gateway.telemetry is not None:
        from gateway.preflight.status import gateway_status

        # GET /status on the admin port: what `gateway preflight` reads from a running gateway.
        admin = gateway.telemetry.admin
        admin.set_status(gateway_status(settings, egress))

        def on_applied(new: Gateway) -> None:  # a live reload: report what serves now
            admin.set_status(gateway_status(new.settings, egress, new.policy))
    drain = Drain(settings.drain)  # SIGTERM: readyz 503, then drain (gateway.drain)
    reloader = None
    if config is not None:
        from gateway.reload import Reloader

        reloader = Reloader(config, gateway, environ=os.environ, adjust=adjust or (lambda s: s),
                            on_applied=on_applied)
    app = create_app(settings, gateway, drain=drain, reloader=reloader)
    if not is_loopback_host(settings.listen.host):
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
        reloader,
    )


def serve(
    config: ConfigOpt,
    host: Annotated[str | None, typer.Option(help="Override listen.host.")] = None,
    port: Annotated[int | None, typer.Option(help="Override listen.port.")] = None,
) -> None:
    """Run the gateway from one YAML config file (fails at start if the file is invalid).

    SIGTERM drains and exits; SIGHUP reloads the file live (an invalid or restart-only change is
    refused whole and the running configuration stays).
    """

    def adjust(settings: GatewaySettings) -> GatewaySettings:
        if host is None and port is None:
            return settings
        listen = settings.listen.model_copy(
            update={k: v for k, v in (("host", host), ("port", port)) if v is not None}
        )
        return settings.model_copy(update={"listen": listen})

    run(adjust(load(config, os.environ)), config.parent, config=config, adjust=adjust)
