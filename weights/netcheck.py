"""Every connection of the hub client is checked after resolution, before it is opened.

A redirect to an allowed host name (``*.hf.co``) proves nothing about where the name leads:
DNS may answer ``169.254.169.254`` (the cloud metadata service) or a private address. The hub
client therefore connects through :class:`CheckedBackend`, an ``httpcore2`` network backend
that resolves the name itself, checks every address (:func:`address_refusal`) and connects to
the checked address (so a second DNS answer cannot move the connection); TLS still verifies
and sends the host name (httpcore passes the origin's host as SNI, not the address).

The address rule:

* always refused: link-local and cloud metadata endpoints, "this network", unspecified,
  broadcast and multicast (the table of :data:`ALWAYS_DENIED`, the same networks
  ``policy.addresses.ALWAYS_DENIED`` lists; ``weights`` is a leaf package and cannot import it);
* private, loopback, shared and reserved addresses (anything not globally routable) only for
  the hub endpoint's own host and for hosts the operator named exactly
  (``--redirect-host cdn.internal``), never through a wildcard (``*.hf.co``);
* everything else is allowed.

:class:`CheckedTransport` adapts an ``httpcore2.ConnectionPool`` on that backend to
``httpx2``'s transport interface with public API only, mapping httpcore2's exceptions to
httpx2's (which the hub client's error mapping expects).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpcore2
import httpx2

from weights.errors import HubError

__all__ = ["ALWAYS_DENIED", "AddressRefusedError", "CheckedBackend", "CheckedTransport",
           "Resolver", "address_refusal"]

#: ``(host, port) -> [address, ...]``: the resolver the backend asks (system by default).
Resolver = Callable[[str, int], list[str]]

ALWAYS_DENIED: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = (
    (ipaddress.ip_network("169.254.0.0/16"), "link-local / cloud metadata"),
    (ipaddress.ip_network("fe80::/10"), "link-local / cloud metadata"),
    (ipaddress.ip_network("fd00:ec2::254/128"), "cloud metadata (AWS IPv6)"),
    (ipaddress.ip_network("100.100.100.200/32"), "cloud metadata (Alibaba)"),
    (ipaddress.ip_network("168.63.129.16/32"), "cloud platform endpoint (Azure wireserver)"),
    (ipaddress.ip_network("0.0.0.0/8"), "'this network' / unspecified"),
    (ipaddress.ip_network("::/128"), "unspecified"),
    (ipaddress.ip_network("255.255.255.255/32"), "broadcast"),
    (ipaddress.ip_network("224.0.0.0/4"), "multicast"),
    (ipaddress.ip_network("ff00::/8"), "multicast"),
)


class AddressRefusedError(HubError):
    """A host resolved to an address the client may not connect to (nothing was sent)."""

    code = "address_refused"


def address_refusal(address: str, *, trusted_name: bool) -> str | None:
    """Why the client may not connect to ``address``, or None.

    Args:
        address: An IP address literal (as resolved).
        trusted_name: The host name is the endpoint's or one the operator named exactly.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for net, reason in ALWAYS_DENIED:
        if ip.version == net.version and ip in net:
            return reason
    if not ip.is_global and not trusted_name:
        return "a private, loopback or reserved address (allowed only for the endpoint's host " \
               "and hosts named exactly)"
    return None


def system_resolver(host: str, port: int) -> list[str]:
    """Addresses of ``host`` from the system resolver (``getaddrinfo``, TCP)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(i[4][0]) for i in infos))


class CheckedBackend(httpcore2.SyncBackend):
    """A network backend that resolves, checks every address, then connects to a checked one.

    Args:
        trusted: Host names whose private addresses are allowed (the endpoint's host, hosts
            named exactly), lower case.
        resolver: Resolves host names (default: the system resolver).
    """

    def __init__(self, trusted: Iterable[str], resolver: Resolver | None = None) -> None:
        self.trusted = frozenset(h.lower().rstrip(".") for h in trusted)
        self.resolver = resolver or system_resolver

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore2.NetworkStream:
        """Resolve ``host``, refuse it if any address is refused, connect to the first.

        Raises:
            AddressRefusedError: An address of ``host`` breaks the rule (module docstring).
            httpcore2.ConnectError: The name does not resolve.
        """
        name = host.lower().rstrip(".")
        try:
            addresses = self.resolver(host, port)
        except OSError as exc:
            raise httpcore2.ConnectError(f"cannot resolve {host}: {exc}") from exc
        if not addresses:
            raise httpcore2.ConnectError(f"{host} has no address")
        for address in addresses:
            reason = address_refusal(address, trusted_name=name in self.trusted)
            if reason is not None:
                raise AddressRefusedError(
                    f"{host} resolves to {address}: {reason}; refused before connecting",
                    hint="if this host is meant to be reached, name it exactly with "
                         "--redirect-host (WEIGHTS_REDIRECT_HOSTS)")
        return super().connect_tcp(addresses[0], port, timeout=timeout,
                                   local_address=local_address, socket_options=socket_options)


_EXCEPTIONS: tuple[tuple[type[Exception], type[Exception]], ...] = (
    (httpcore2.ConnectTimeout, httpx2.ConnectTimeout),
    (httpcore2.ReadTimeout, httpx2.ReadTimeout),
    (httpcore2.WriteTimeout, httpx2.WriteTimeout),
    (httpcore2.PoolTimeout, httpx2.PoolTimeout),
    (httpcore2.ConnectError, httpx2.ConnectError),
    (httpcore2.ReadError, httpx2.ReadError),
    (httpcore2.WriteError, httpx2.WriteError),
    (httpcore2.RemoteProtocolError, httpx2.RemoteProtocolError),
    (httpcore2.LocalProtocolError, httpx2.LocalProtocolError),
    (httpcore2.UnsupportedProtocol, httpx2.UnsupportedProtocol),
    (httpcore2.ProxyError, httpx2.ProxyError),
    (httpcore2.TimeoutException, httpx2.TimeoutException),
    (httpcore2.NetworkError, httpx2.NetworkError),
)


def _mapped(exc: Exception) -> Exception:
    for theirs, ours in _EXCEPTIONS:
        if isinstance(exc, theirs):
            return ours(str(exc))
    return exc


class _Body(httpx2.SyncByteStream):
    def __init__(self, stream: Iterable[bytes], close: Callable[[], None]) -> None:
        self._stream = stream
        self._close = close

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._stream
        except (httpcore2.TimeoutException, httpcore2.NetworkError,
                httpcore2.ProtocolError) as exc:
            raise _mapped(exc) from exc

    def close(self) -> None:
        self._close()


class CheckedTransport(httpx2.BaseTransport):
    """An ``httpx2`` transport over an ``httpcore2.ConnectionPool`` on :class:`CheckedBackend`.

    Args:
        backend: The checking network backend.
        ssl_context: TLS settings (default: ``httpx2.create_ssl_context()``, as httpx2's own
            transport).
    """

    def __init__(self, backend: CheckedBackend, ssl_context: ssl.SSLContext | None = None) -> None:
        self._pool = httpcore2.ConnectionPool(
            ssl_context=ssl_context or httpx2.create_ssl_context(), network_backend=backend)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send ``request`` through the checked pool (httpcore2 errors as httpx2's)."""
        url = request.url
        req = httpcore2.Request(
            method=request.method,
            url=httpcore2.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                              target=url.raw_path),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            resp = self._pool.handle_request(req)
        except (httpcore2.TimeoutException, httpcore2.NetworkError,
                httpcore2.ProtocolError, httpcore2.UnsupportedProtocol) as exc:
            raise _mapped(exc) from exc
        stream: Any = resp.stream
        return httpx2.Response(status_code=resp.status, headers=resp.headers,
                               stream=_Body(stream, stream.close), extensions=resp.extensions)

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()
