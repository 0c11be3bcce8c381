"""The client-facing server's sections of the gateway config: ``listen:``, ``limits:`` and
``reload:``.

Read by :mod:`gateway.serving.run` and :mod:`gateway.serving.supervisor` (sockets, TLS),
:func:`gateway.serving.server.server_limits` (the timer of every connection state, the
connection cap) and :mod:`gateway.serving.reload` (the file watch). ``limits`` also bounds the
request path: the body read (``max_body_bytes``, ``client_body_timeout_s``;
:mod:`gateway.relay.pipeline`), the upstream pool (``max_upstream_connections``) and the
headers relayed to the replicas (``forward_headers``; :mod:`gateway.app`).

```yaml
listen: {host: 0.0.0.0, port: 8080}        # tls_cert_file + tls_key_file: HTTPS
limits: {max_body_bytes: 16777216, client_header_timeout_s: 10}
reload: {watch: true, interval_s: 2}
```
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from gateway.config.base import FrozenSection

__all__ = ["LimitSettings", "ListenSettings", "ReloadSettings", "is_loopback_host"]

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


class ListenSettings(FrozenSection):
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


class LimitSettings(FrozenSection):
    """Request and connection limits: sizes in bytes, durations in seconds (``*_s``), caps in
    connections."""

    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    # Longest silence (seconds) while a client sends its request body before 408 (slow clients).
    client_body_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    # Bytes per second a request body must keep up after its first client_body_timeout_s: each
    # this many bytes received moves the whole body's deadline one second later (Apache httpd
    # mod_reqtimeout's MinRate; its default for bodies is 500). A client trickling a byte now
    # and then is answered 408 instead of holding its connection for ever. 0: no such deadline.
    client_body_min_rate_bytes_s: float = Field(default=500.0, ge=0, allow_inf_nan=False)
    # Seconds a client connection may take to send a complete request head (from the moment it
    # opens, or from the first byte of a later request on a kept-alive connection).
    client_header_timeout_s: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    # Seconds an idle keep-alive client connection is kept open between requests.
    keep_alive_timeout_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    # Seconds a client may leave its socket buffer full (not reading) while a response is
    # written before its connection is closed (and its upstream request ended).
    client_send_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    # Concurrent client connections. One more closes the connection idle the longest (no
    # complete request head yet, or idle between requests); only when every connection carries
    # a request is it answered 503 at once and closed.
    max_client_connections: int = Field(default=4096, gt=0)
    # Concurrent client connections from one client address (the peer's IP as the socket sees
    # it), or None: no such cap. One more closes that address's connection idle the longest, or
    # is answered 429 when all of them carry requests. Behind a load balancer, proxy or NAT
    # many clients share one address: leave it unset there, or size it for the whole proxy.
    max_client_connections_per_address: int | None = Field(default=None, gt=0)
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


class ReloadSettings(FrozenSection):
    """Live reload (:mod:`gateway.serving.reload`): SIGHUP always reloads; ``watch`` also polls
    files.

    Attributes:
        watch: Poll the config file, its ``keys_file``, the policy file and the replicas'
            ``api_key_file`` every ``interval_s`` seconds and reload when their content
            changes (content hashes, so a Kubernetes ConfigMap/Secret symlink swap counts).
        interval_s: Seconds between two polls.
    """

    watch: bool = False
    interval_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)


def is_loopback_host(host: str | None) -> bool:
    """True when ``host`` is a loopback literal (``127.0.0.0/8``, ``::1``) or ``localhost``;
    ``None`` (a URL without a host) is not (start-up warnings, ``http://`` only to loopback)."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
