"""How the relay opens an upstream connection: resolve, check, connect (:data:`Dialer`).

:func:`resolver_dialer` resolves with the same resolver and socket factory as the upstream
aiohttp session's connector (with the egress policy those are the policy's pinning resolver and
checked socket factory, so every new connection is checked by the one egress implementation,
:mod:`policy.transport`). One address is connected here, in the caller's step when the
connection is made at once (loopback and same-host replicas); several are raced with Happy
Eyeballs (RFC 8305, ``aiohappyeyeballs``). :class:`gateway.h1.client.RelayClient` adds TLS and
the HTTP exchange.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import socket
from collections.abc import Awaitable, Callable

import aiohappyeyeballs
import aiohttp
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import AbstractResolver

__all__ = ["Dialer", "resolver_dialer"]

Dialer = Callable[[str, int], Awaitable[socket.socket]]
"""``(host, port) -> connected socket``; raises ``OSError`` or ``policy.EgressDenied``."""


def resolver_dialer(
    resolver: AbstractResolver | None = None,
    socket_factory: Callable[[AddrInfoType], socket.socket] | None = None,
    *,
    happy_eyeballs_delay_s: float | None = 0.25,
) -> Dialer:
    """A dialer that resolves with ``resolver`` and connects with Happy Eyeballs (RFC 8305).

    Only public APIs: ``AbstractResolver.resolve`` (aiohttp's resolver interface, which the
    egress policy's pinning resolver implements) and ``aiohappyeyeballs.start_connection``,
    whose ``socket_factory`` creates each socket (the egress policy's address check before
    every connect). The aiohttp session of the health prober and the metrics scraper is built
    from the same resolver and factory (:func:`policy.make_connector`), so both clients resolve
    and connect by one rule.

    Args:
        resolver: Hostname lookups (default: ``aiohttp.ThreadedResolver``, the system
            ``getaddrinfo`` in a thread). Address literals are resolved too when a resolver is
            given (the policy's resolver checks them); with the default, a literal
            (``127.0.0.1``, ``::1``) is used as it is, without the thread hand-off
            (``getaddrinfo`` would return it unchanged, at ~150 us of CPU per new connection).
        socket_factory: Makes the socket for one address (default: a plain socket).
        happy_eyeballs_delay_s: Seconds before the next address is tried in parallel
            (RFC 8305 section 5 recommends 250 ms); ``None``: one address at a time.

    Raises (from the returned dialer):
        OSError: The name did not resolve, or no address accepted the connection.
        policy.EgressDenied: The policy refused the name or an address.
    """
    the_resolver = resolver if resolver is not None else aiohttp.ThreadedResolver()
    literals = resolver is None

    async def dial(host: str, port: int) -> socket.socket:
        literal = _literal_address(host, port) if literals else None
        if literal is not None:
            # The socket factory still checks the address (always-denied ones).
            return await _connect_one(literal, socket_factory)
        infos = await the_resolver.resolve(host, port, socket.AF_UNSPEC)
        addr_infos: list[AddrInfoType] = []
        for info in infos:
            address: tuple[str, int] | tuple[str, int, int, int] = (
                (info["host"], info["port"], 0, 0) if info["family"] == socket.AF_INET6
                else (info["host"], info["port"]))
            addr_infos.append((info["family"], socket.SOCK_STREAM, info["proto"], "", address))
        if not addr_infos:
            raise OSError(f"no address of {host}")
        if len(addr_infos) == 1:  # nothing to race: Happy Eyeballs makes this one attempt
            return await _connect_one(addr_infos[0], socket_factory)
        return await aiohappyeyeballs.start_connection(
            addr_infos, happy_eyeballs_delay=happy_eyeballs_delay_s,
            socket_factory=socket_factory,
        )

    return dial


async def _connect_one(addr_info: AddrInfoType,
                       socket_factory: Callable[[AddrInfoType], socket.socket] | None,
                       ) -> socket.socket:
    """Connect a non-blocking socket to one address; return it connected.

    A connection that is made at once (loopback and same-host replicas: the kernel completes
    the handshake inside ``connect``, which still answers ``EINPROGRESS``) is returned without
    a turn of the event loop (one ``poll(2)`` without waiting tells); any other waits for the
    socket to become writable, as ``loop.sock_connect`` does. In a burst of new streams each
    request so reaches its replica in the step that parsed it.

    Raises:
        OSError: The connection was refused or failed (``ConnectionRefusedError`` ...).
        policy.EgressDenied: ``socket_factory`` refused the address.
    """
    family, type_, proto, _, address = addr_info
    sock = (socket_factory(addr_info) if socket_factory is not None
            else socket.socket(family, type_, proto))
    try:
        sock.setblocking(False)
        err = sock.connect_ex(address)
        if err in (errno.EINPROGRESS, errno.EAGAIN):
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLOUT)
            if not poller.poll(0):
                await _writable(sock)
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise OSError(err, f"Connect call failed {address}: {os.strerror(err)}")
    except BaseException:
        sock.close()
        raise
    return sock


async def _writable(sock: socket.socket) -> None:
    """Wait until ``sock`` is writable (its connect finished, made or failed)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def on_writable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_writer(fd, on_writable)
    try:
        await ready
    finally:
        loop.remove_writer(fd)


def _literal_address(host: str, port: int) -> AddrInfoType | None:
    """The address info of ``host`` when it is an IPv4 or IPv6 address in standard notation
    (what ``getaddrinfo`` returns for it), else ``None`` (a name, or a form to resolve)."""
    try:
        socket.inet_pton(socket.AF_INET, host)
    except OSError:
        pass
    else:
        return (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port))
    try:
        socket.inet_pton(socket.AF_INET6, host)
    except OSError:
        return None  # a name, or a scoped IPv6 literal (getaddrinfo reads its zone)
    return (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port, 0, 0))
