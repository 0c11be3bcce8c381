"""The upstream aiohttp session, and the mapping of upstream client errors to ours.

The relay's requests go through its own client (:mod:`gateway.h1`), which dials through this
session's connector; the session itself serves health probes and metrics scraping.

One :class:`aiohttp.ClientSession` per app, created in the lifespan: keep-alive pooled
connections, ``trust_env=False`` (proxy variables are ignored), no cookie jar, no automatic
decompression (bytes are relayed as they come) and never a redirect (``allow_redirects=False`` on
every call). The connector is injectable: the egress policy passes a factory that
returns its policy-checked connector.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Sequence

import aiohttp
from aiohttp.client_middlewares import ClientMiddlewareType

from gateway.config.settings import GatewaySettings
from gateway.errors import (
    ConfigError,
    GatewayError,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamEgressDenied,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.h1 import (
    ConnectFailed,
    ConnectionClosed,
    ConnectTimedOut,
    IncompleteBody,
    ProtocolError,
)
from gateway.h1.asgi_io import HeldEndTooLong
from gateway.relay.settings import UpstreamTlsSettings
from policy import EgressDenied, RedirectRefused, denied_address_socket_factory

__all__ = ["ConnectorFactory", "map_exception", "new_session", "tls_context"]

ConnectorFactory = Callable[[], aiohttp.BaseConnector]

USER_AGENT = "sovereign-gateway/0.1"


def tls_context(tls: UpstreamTlsSettings) -> ssl.SSLContext | bool:
    """The SSL setting for ``https://`` replicas (``True``: system CAs, full verification).

    Raises:
        ConfigError: A configured CA, certificate or key file cannot be loaded.
    """
    if tls.ca_file is None and tls.cert_file is None:
        return True
    try:
        ctx = ssl.create_default_context(
            cafile=str(tls.ca_file) if tls.ca_file is not None else None
        )
        if tls.cert_file is not None and tls.key_file is not None:
            ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"upstream_tls: cannot load TLS files: {exc}") from exc
    return ctx


def new_session(
    settings: GatewaySettings,
    connector_factory: ConnectorFactory | None = None,
    middlewares: Sequence[ClientMiddlewareType] = (),
    *,
    pooled: bool = True,
) -> aiohttp.ClientSession:
    """Create the app's upstream session (call inside a running event loop).

    Args:
        settings: ``timeouts`` (``connect_s``, ``upstream_keep_alive_s``) and
            ``limits.max_upstream_connections`` are used.
        connector_factory: Returns the connector to use; default a plain ``TCPConnector``.
        middlewares: aiohttp client middlewares, outermost first (telemetry's client spans,
            the egress policy's URL and redirect checks).
        pooled: ``False`` for the short-lived session of one retry after a stale connection
            (the caller closes it, and with it its connector); the default connector then
            closes every connection after its response (``force_close``).
    """
    if connector_factory is not None:
        connector = connector_factory()
    elif pooled:
        # Idle connections are dropped before the backend would drop them (vLLM/uvicorn: 5 s),
        # so a request rarely goes out on a connection that the backend is closing.
        connector = aiohttp.TCPConnector(
            limit=settings.limits.max_upstream_connections,
            limit_per_host=0,
            ttl_dns_cache=10,
            keepalive_timeout=settings.timeouts.upstream_keep_alive_s,
            socket_factory=denied_address_socket_factory(),  # metadata: never, policy or not
        )
    else:
        connector = aiohttp.TCPConnector(
            limit=settings.limits.max_upstream_connections,
            limit_per_host=0,
            ttl_dns_cache=10,
            force_close=True,
            socket_factory=denied_address_socket_factory(),
        )
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=settings.timeouts.connect_s,
        sock_connect=settings.timeouts.connect_s,
        sock_read=None,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        trust_env=False,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
        raise_for_status=False,
        middlewares=tuple(middlewares),
    )


def map_exception(exc: BaseException, replica_label: str) -> GatewayError:
    """Translate a client/OS error into a gateway error (the caller raises it ``from exc``).

    Covers the relay's own client (:mod:`gateway.h1`) and aiohttp (health probes, scraping).

    Args:
        exc: The exception raised while talking to the replica.
        replica_label: :attr:`Replica.label` for the message (never the URL or request content).

    Returns:
        :class:`UpstreamConnectError` / :class:`UpstreamConnectTimeout` for connection
        failures (both retryable),
        :class:`UpstreamTimeout` for timeouts, :class:`UpstreamError` otherwise.
    """
    if isinstance(exc, EgressDenied):
        # The policy-checked transport (or the process guard) refused: never retried.
        code = "redirect_refused" if isinstance(exc, RedirectRefused) else None
        return UpstreamEgressDenied(
            f"The egress policy refused the connection to the model backend ({replica_label}): "
            f"{exc.reason}",
            code=code,
        )
    if isinstance(exc, ConnectFailed):
        if exc.certificate:
            return UpstreamConnectError(
                f"The TLS certificate of the model backend ({replica_label}) could not be "
                "verified (see upstream_tls.ca_file)."
            )
        return UpstreamConnectError(f"Could not connect to the model backend ({replica_label}).")
    if isinstance(exc, ConnectTimedOut):
        return UpstreamConnectTimeout(
            f"Timed out connecting to the model backend ({replica_label})."
        )
    if isinstance(exc, ConnectionClosed):
        return UpstreamError(f"The model backend ({replica_label}) closed the connection.")
    if isinstance(exc, IncompleteBody):
        return UpstreamError(f"The model backend ({replica_label}) sent an incomplete response.")
    if isinstance(exc, ProtocolError):
        return UpstreamError(
            f"The model backend ({replica_label}) sent a malformed HTTP response: {exc}"
        )
    if isinstance(exc, HeldEndTooLong):
        return UpstreamError(f"The model backend ({replica_label}) sent {exc}.")
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return UpstreamConnectError(
            f"The TLS certificate of the model backend ({replica_label}) could not be verified "
            "(see upstream_tls.ca_file)."
        )
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamConnectTimeout(
            f"Timed out connecting to the model backend ({replica_label})."
        )
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamConnectError(f"Could not connect to the model backend ({replica_label}).")
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return UpstreamTimeout(f"The model backend ({replica_label}) timed out.")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return UpstreamError(f"The model backend ({replica_label}) closed the connection.")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return UpstreamError(f"The model backend ({replica_label}) sent an incomplete response.")
    name = type(exc).__name__
    return UpstreamError(f"Error talking to the model backend ({replica_label}): {name}")
