"""The relay's upstream HTTP/1.1 client: a bounded keep-alive pool per replica origin.

Connections are opened through a :class:`Dialer`, which resolves and connects with the same
resolver and socket factory as the upstream aiohttp session's connector
(:func:`resolver_dialer`; with the egress policy those are the policy's pinning resolver and
checked socket factory, so every new connection is checked by the one egress implementation,
:mod:`policy.transport`), then TLS for ``https://`` replicas with the configured context. A
connection returns to its origin's idle list only when its response was read whole and the
replica kept it open; idle
connections close after ``keep_alive_s`` (below the backends' keep-alive). At most ``limit``
connections are open at once (idle ones of other origins are closed to make room; ``0``: no
limit). A request that asks for a ``fresh`` connection gets a new one that is closed after its
response (the retry after a stale pooled connection).

Errors: :class:`ConnectFailed`, :class:`ConnectTimedOut`, ``policy.EgressDenied`` (refused by
the egress policy), and from the exchange :class:`~gateway.h1.connection.ConnectionClosed`,
:class:`~gateway.h1.connection.IncompleteBody`, :class:`~gateway.h1.framing.ProtocolError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohappyeyeballs
import aiohttp
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import AbstractResolver

from gateway.h1.connection import H1Connection, Sink
from gateway.h1.framing import Head

__all__ = [
    "AttemptObserver",
    "ConnectFailed",
    "ConnectTimedOut",
    "Dialer",
    "RelayClient",
    "Response",
    "resolver_dialer",
]

Dialer = Callable[[str, int], Awaitable[socket.socket]]
"""``(host, port) -> connected socket``; raises ``OSError`` or ``policy.EgressDenied``."""


class ConnectFailed(Exception):
    """No TCP/TLS connection could be made.

    Attributes:
        certificate: The replica's TLS certificate failed verification.
    """

    def __init__(self, message: str, certificate: bool = False) -> None:
        super().__init__(message)
        self.certificate = certificate


class ConnectTimedOut(Exception):
    """The connection (TCP and TLS) was not made within ``connect_s``."""


class AttemptObserver(Protocol):
    """Told about every upstream attempt (telemetry's client spans).

    ``attempt_started`` may add headers (``traceparent``) and returns a token handed back to
    exactly one of ``attempt_answered`` (the response head arrived) or ``attempt_failed``.
    """

    def attempt_started(
        self, method: str, host: str, port: int, headers: dict[str, str]
    ) -> object: ...

    def attempt_answered(self, token: object, status: int) -> None: ...

    def attempt_failed(self, token: object, exc: BaseException) -> None: ...


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
            # The socket factory below still checks the address (always-denied ones).
            return await aiohappyeyeballs.start_connection(
                [literal], happy_eyeballs_delay=happy_eyeballs_delay_s,
                socket_factory=socket_factory,
            )
        infos = await the_resolver.resolve(host, port, socket.AF_UNSPEC)
        addr_infos: list[AddrInfoType] = []
        for info in infos:
            address: tuple[str, int] | tuple[str, int, int, int] = (
                (info["host"], info["port"], 0, 0) if info["family"] == socket.AF_INET6
                else (info["host"], info["port"]))
            addr_infos.append((info["family"], socket.SOCK_STREAM, info["proto"], "", address))
        if not addr_infos:
            raise OSError(f"no address of {host}")
        return await aiohappyeyeballs.start_connection(
            addr_infos, happy_eyeballs_delay=happy_eyeballs_delay_s,
            socket_factory=socket_factory,
        )

    return dial


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


@dataclass(frozen=True, slots=True)
class _Origin:
    host: str
    port: int
    tls: bool
    prefix: str  # path prefix of the replica URL (no trailing slash)
    host_header: str

    @classmethod
    def of(cls, url: str) -> _Origin:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        host = parts.hostname or ""
        port = parts.port or (443 if tls else 80)
        shown = f"[{host}]" if ":" in host else host
        header = shown if port == (443 if tls else 80) else f"{shown}:{port}"
        return cls(host, port, tls, parts.path.rstrip("/"), header)


class Response:
    """An upstream response whose head was read; the body is read with :meth:`read`.

    Attributes:
        status: The status code.
        headers: Lower-case name -> value.
        content_length: The declared body length, or ``None``.
        host: The replica's host (for messages; never the request content).
        port: Its port.
    """

    __slots__ = ("_client", "_conn", "_fresh", "_origin", "content_length", "headers", "host",
                 "port", "read", "read_into", "status")

    def __init__(self, client: RelayClient, conn: H1Connection, origin: _Origin, head: Head,
                 fresh: bool) -> None:
        self._client, self._conn, self._origin, self._fresh = client, conn, origin, fresh
        self.status = head.status
        self.headers = head.headers
        self.content_length = head.content_length if not head.chunked else None
        self.host, self.port = origin.host, origin.port
        self.read: Callable[[], Coroutine[Any, Any, bytes]] = conn.read
        """``await read()``: the body bytes received so far, ``b""`` at its end."""
        self.read_into: Callable[[Sink], Coroutine[Any, Any, bytes | None]] = conn.read_into
        """``await read_into(sink)``: body pieces handed to ``sink`` as they arrive
        (:meth:`~gateway.h1.connection.H1Connection.read_into`)."""

    @property
    def complete(self) -> bool:
        """The whole body has been received (:meth:`read` never waits again)."""
        return self._conn.body_done

    def release(self) -> None:
        """Done with the response: the connection goes back to the pool if reusable."""
        self._client._release(self._origin, self._conn, self._fresh)

    def close(self) -> None:
        """Abandon the response: the connection is closed, never reused."""
        self._conn.finish()
        self._conn.abort()


class RelayClient:
    """The pooled upstream client of the relay (see module docstring).

    Args:
        dial: Opens TCP connections (:func:`resolver_dialer`).
        tls: ``ssl`` setting for ``https://`` replicas (``True``: system CAs, or a context).
        limit: Most connections open at once (in use and idle); ``0``: no limit.
        keep_alive_s: Idle time in seconds after which a pooled connection is closed.
        connect_s: Longest time in seconds for TCP and TLS connection set-up.
        observers: Told about every attempt (client spans).
    """

    def __init__(self, dial: Dialer, *, tls: ssl.SSLContext | bool, limit: int,
                 keep_alive_s: float, connect_s: float,
                 observers: Sequence[AttemptObserver] = ()) -> None:
        self._dial = dial
        self._tls = tls if isinstance(tls, ssl.SSLContext) else None
        self._limit = limit
        self._keep_alive_s = keep_alive_s
        self.connect_s = connect_s
        """Longest TCP and TLS set-up in seconds for the next connections (a live reload of
        ``timeouts.connect_s`` sets it)."""
        self._observers = tuple(observers)
        # Per origin, idle connections with the loop time each became idle, oldest first.
        self._idle: dict[_Origin, list[tuple[H1Connection, float]]] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._origins: dict[str, _Origin] = {}
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    @property
    def open_connections(self) -> int:
        """Connections open now (in use and idle)."""
        return self._open

    def idle_connections(self) -> int:
        """Idle pooled connections now."""
        return sum(len(v) for v in self._idle.values())

    async def post(self, url: str, path: str, headers: dict[str, str], body: bytes, *,
                   fresh: bool = False,
                   on_slot: Callable[[], None] | None = None) -> Response:
        """Send ``POST url+path`` and return the response once its head arrived.

        Args:
            url: The replica's base URL (``http(s)://host[:port][/prefix]``).
            path: The request path (``/v1/...``).
            headers: Request headers (lower-case names; ``host`` and ``content-length`` are
                set here). Observers may add to it.
            body: The request body.
            fresh: Use a new connection and close it after the response.
            on_slot: Called once the request has its connection (an idle one, or room for a
                new one): until then it waits for one of the ``limit`` connections.

        Raises:
            ConnectFailed: TCP/TLS connection failed.
            ConnectTimedOut: Not connected within ``connect_s``.
            policy.EgressDenied: The egress policy refused the address.
            ConnectionClosed: The connection closed before the response head was read.
            ProtocolError: The response head is malformed.
            ValueError: A header contains CR, LF or NUL.
        """
        origin = self._origins.get(url)
        if origin is None:
            origin = self._origins[url] = _Origin.of(url)
        tokens = [(o, o.attempt_started("POST", origin.host, origin.port, headers))
                  for o in self._observers]
        conn: H1Connection | None = None
        try:
            conn = await self._acquire(origin, fresh, on_slot)
            request = _request_head(origin, path, headers, len(body))
            if len(body) <= _JOIN_MAX:
                conn.send(request + body)  # one write, one send() for the usual small body
            else:
                conn.send(request, body)  # not joined: a join would copy the body
            head = await conn.read_head()
        except BaseException as exc:
            if conn is not None:
                conn.finish()
                conn.abort()
            for observer, token in tokens:
                observer.attempt_failed(token, exc)
            raise
        for observer, token in tokens:
            observer.attempt_answered(token, head.status)
        return Response(self, conn, origin, head, fresh)

    async def close(self, wait_s: float = 1.0) -> None:
        """Close every idle connection and refuse new requests.

        Args:
            wait_s: Longest wait in seconds for the event loop to close the sockets.
        """
        self._closed = True
        closing = [conn for idle in self._idle.values() for conn, _ in idle]
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for idle in list(self._idle.values()):
            for conn, _ in idle:
                conn.abort()
        self._idle.clear()
        if closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await asyncio.gather(*(conn.wait_closed() for conn in closing))

    # the pool -----------------------------------------------------------------------------

    async def _acquire(self, origin: _Origin, fresh: bool,
                       on_slot: Callable[[], None] | None) -> H1Connection:
        while True:
            if self._closed:
                raise ConnectFailed("the upstream client is closed")
            idle = self._idle.get(origin)
            while idle and not fresh:
                conn, _ = idle.pop()  # the most recently used: least likely to be stale
                if conn.usable:
                    if on_slot is not None:
                        on_slot()
                    return conn
                conn.abort()  # closed, closing, or bytes arrived while idle: never reused
            if self._limit <= 0 or self._open < self._limit:
                if on_slot is not None:
                    on_slot()
                return await self._connect(origin)
            closing = self._close_one_idle()
            if closing is not None:
                # Its slot is ours once it is closed (unless another request is faster): one
                # idle connection closed per request that needs room, not every idle one.
                await closing.wait_closed()
            else:
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    await waiter
                except BaseException:
                    if waiter.done() and not waiter.cancelled():
                        self._wake_one()  # woken but leaving (cancelled): pass the slot on
                    raise
                finally:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)

    async def _connect(self, origin: _Origin) -> H1Connection:
        loop = asyncio.get_running_loop()
        self._open += 1
        conn = H1Connection(self._lost)
        try:
            async with asyncio.timeout(self.connect_s):
                sock = await self._dial(origin.host, origin.port)
                try:
                    await loop.create_connection(
                        lambda: conn, sock=sock, ssl=self._ssl() if origin.tls else None,
                        server_hostname=origin.host.rstrip(".") if origin.tls else None,
                    )
                except BaseException:
                    sock.close()
                    raise
        except ssl.SSLCertVerificationError as exc:
            self._not_opened(conn)
            raise ConnectFailed(f"certificate verification failed: {exc}", True) from exc
        except TimeoutError as exc:
            self._not_opened(conn)
            raise ConnectTimedOut(f"not connected within {self.connect_s} s") from exc
        except OSError as exc:
            self._not_opened(conn)
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            self._not_opened(conn)
            raise
        return conn

    def _ssl(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def _not_opened(self, conn: H1Connection) -> None:
        conn.detach()
        conn.abort()
        self._open -= 1
        self._wake_one()

    def _lost(self, conn: H1Connection) -> None:
        self._open -= 1
        for origin, idle in self._idle.items():
            for i, (c, _) in enumerate(idle):
                if c is conn:
                    del idle[i]
                    if not idle:
                        del self._idle[origin]
                    break
            else:
                continue
            break
        self._wake_one()

    def _release(self, origin: _Origin, conn: H1Connection, fresh: bool) -> None:
        conn.finish()
        if fresh or self._closed or not conn.reusable:
            if conn.body_done:
                conn.close()
            else:
                conn.abort()
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._idle.setdefault(origin, []).append((conn, now))
        if self._sweep is None:
            self._sweep = loop.call_at(now + self._keep_alive_s, self._expire)
        self._wake_one()

    def _expire(self) -> None:
        """Close the connections idle for ``keep_alive_s``; run again when the next one is due.

        One timer for the pool instead of one per release (a timer handle made and cancelled
        per request): each connection still closes ``keep_alive_s`` after it became idle.
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        keep = self._keep_alive_s
        due: float | None = None
        for origin, idle in list(self._idle.items()):
            while idle and idle[0][1] + keep <= now:
                conn, _ = idle.pop(0)
                conn.close()
            if idle:
                due = idle[0][1] if due is None else min(due, idle[0][1])
            else:
                del self._idle[origin]
        self._sweep = loop.call_at(due + keep, self._expire) if due is not None else None

    def _close_one_idle(self) -> H1Connection | None:
        """Close the longest idle connection of any origin (room for a new one); return it."""
        for idle in self._idle.values():
            if idle:
                conn, _ = idle.pop(0)
                conn.close()
                return conn
        return None

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


_JOIN_MAX = 64 * 1024
"""Largest body joined to the head for one write (bytes); a larger one is written apart."""


def _request_head(origin: _Origin, path: str, headers: dict[str, str], length: int) -> bytes:
    """The request line and header section (``ValueError`` on CR/LF/NUL in a header)."""
    lines = [f"POST {origin.prefix}{path} HTTP/1.1\r\nhost: {origin.host_header}\r\n"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\0" in value or "\r" in name or "\n" in name:
            raise ValueError(f"invalid character in header {name!r}")
        lines.append(f"{name}: {value}\r\n")
    lines.append(f"content-length: {length}\r\n\r\n")
    return "".join(lines).encode("latin-1")
