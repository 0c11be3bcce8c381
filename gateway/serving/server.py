"""Running the ASGI app for ``gateway serve``: listeners, lifespan, signals, drain.

The gateway's own server (:class:`GatewayServer`, on asyncio's public API; each connection a
:class:`gateway.h1.server.ServerProtocol`) so that the start and the end of serving are named
steps: once the lifespan start-up finished (state built, pools open, audit chain opened),
the heap that lives as long as the process is frozen out of the garbage collector
(:mod:`gateway.serving.runtime_tuning`); on SIGTERM or SIGINT the server drains
(:mod:`gateway.serving.drain`)
and :func:`run_server` returns the signal that stopped it (``gateway serve`` then exits 0 after
SIGTERM, an orchestrator's normal stop, and 130 after SIGINT, so that a Ctrl-C never reads as
success); on SIGHUP it reloads its configuration (:mod:`gateway.serving.reload`) without closing a
connection.

A worker of ``gateway serve --workers N`` (:mod:`gateway.serving.supervisor`) runs the same server
on the
listening socket it inherited from the supervisor, tells the supervisor when it started, and
ignores SIGINT: the supervisor forwards the signals it receives (a Ctrl-C reaches the whole
process group, and a worker must count it once).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import signal
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clishell import CliError
from gateway.h1.lifespan import Lifespan
from gateway.h1.refusal import EvictionHook, RefusalHook
from gateway.h1.server import ServerContext, ServerLimits, ServerProtocol
from gateway.h1.transport import Listener, listen_plain
from gateway.serving.drain import Drain
from gateway.serving.hangup import HangupLatch
from gateway.serving.runtime_tuning import freeze_startup_heap, tune_gc

if TYPE_CHECKING:
    from gateway.serving.reload import Reloader
    from gateway.serving.settings import LimitSettings

_log = logging.getLogger(__name__)

FINAL_WRITE_S = 1.0
"""Seconds after the drain deadline that a cut request has to write its final event; its
connection is then closed (a client that does not read would hold the shutdown)."""

LISTEN_BACKLOG = 2048
"""Connections the kernel queues on a listening socket before it refuses more (the supervisor
of ``--workers N`` binds with it too)."""

ACCEPTS_PER_WAKEUP = 1
"""Connections the event loop accepts each time a listening socket is ready (nginx's default,
``multi_accept off``). asyncio accepts up to the server's ``backlog`` per readiness: a burst of
new streams was then accepted, parsed and started phase by phase for every connection before
any of them reached its replica, so the first token of each waited for the whole burst's CPU.
One per wake-up interleaves accepting with the work of the connections already in (burst TTFT
p50 down by a quarter to a third, docs/benchmarks.md); the listening socket stays readable, so
the next loop iteration accepts the next one."""

__all__ = ["ACCEPTS_PER_WAKEUP", "FINAL_WRITE_S", "LISTEN_BACKLOG", "STARTUP_FAILURE",
           "GatewayServer", "ServerConfig", "run_server", "server_limits"]

STARTUP_FAILURE = 3
"""Exit status when the server did not start."""


def server_limits(limits: LimitSettings) -> ServerLimits:
    """The connection bounds of ``limits`` (the ``limits:`` section)."""
    return ServerLimits(
        header_timeout_s=limits.client_header_timeout_s,
        keep_alive_timeout_s=limits.keep_alive_timeout_s,
        body_timeout_s=limits.client_body_timeout_s,
        body_min_rate_bytes_s=limits.client_body_min_rate_bytes_s,
        send_timeout_s=limits.client_send_timeout_s,
        max_connections=limits.max_client_connections,
        max_connections_per_address=limits.max_client_connections_per_address,
    )


@dataclass
class ServerConfig:
    """What the server serves and where.

    Attributes:
        app: The ASGI application (its lifespan is run).
        host: Address to bind (unless sockets are given to :meth:`GatewayServer.serve`).
        port: Port to bind.
        limits: The connection bounds.
        body_limit: ``limits.max_body_bytes`` in force now, in bytes.
        on_refused: Told of each request refused before the app saw it.
        on_evicted: Told of each idle connection closed to make room for a new one.
        ssl_certfile: With ``ssl_keyfile``: serve HTTPS with this certificate chain (PEM).
        ssl_keyfile: The private key of ``ssl_certfile`` (PEM).
        ssl_context: Serve HTTPS with this context (wins over the files; mTLS: one that
            requests client certificates).
        timeout_graceful_shutdown: Seconds a stop waits for requests in progress before it
            cancels them.
        lifespan: Run the app's lifespan.
        routes: Request paths served by their own ASGI callable instead of ``app`` (exact
            match on the decoded path; :func:`gateway.app.direct_routes`).
    """

    app: Any
    host: str = "127.0.0.1"
    port: int = 8000
    limits: ServerLimits = field(default_factory=ServerLimits)
    body_limit: Callable[[], int] = lambda: 16 * 1024 * 1024
    on_refused: RefusalHook | None = None
    on_evicted: EvictionHook | None = None
    ssl_certfile: Path | str | None = None
    ssl_keyfile: Path | str | None = None
    ssl_context: ssl.SSLContext | None = None
    timeout_graceful_shutdown: float = 10.0
    lifespan: bool = True
    routes: Mapping[str, Any] = field(default_factory=dict)

    def tls(self) -> ssl.SSLContext | None:
        """The TLS context connections are served through, ``None`` for plain HTTP."""
        if self.ssl_context is not None:
            return self.ssl_context
        if self.ssl_certfile is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        return context


class GatewayServer:
    """The gateway's HTTP server: freezes the start-up heap once started; drains on SIGTERM;
    reloads on SIGHUP.

    Args:
        config: What to serve and where.
        drain: The drain state shared with the app (``/readyz``, the relay); ``None``: stop
            gracefully at once.
        reloader: Reloads the configuration on SIGHUP (``None``: SIGHUP keeps its default).
        on_started: Called once serving started (a worker tells its supervisor).
        ignore_sigint: Ignore SIGINT (a worker: its supervisor forwards SIGINT as SIGTERM).

    Attributes:
        started: Serving began (listening, lifespan started).
        should_exit: A stop was asked (the listeners close, requests in progress end).
        force_exit: A second stop was asked: requests in progress are cancelled at once.
        failure: Why the server did not start (one line), or ``None``.
        stopped_by: The first signal that stopped the server.
    """

    def __init__(
        self, config: ServerConfig, drain: Drain | None = None,
        reloader: Reloader | None = None, *,
        on_started: Callable[[], None] | None = None,
        ignore_sigint: bool = False,
    ) -> None:
        self.config = config
        self.drain = drain
        self.reloader = reloader
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_started = on_started
        self._ignore_sigint = ignore_sigint
        self.started = False
        self.should_exit = False
        self.force_exit = False
        self.failure: str | None = None
        self.stopped_by: int | None = None
        self.context = ServerContext(config.app, config.limits, config.body_limit,
                                     config.on_refused, routes=config.routes,
                                     on_evicted=config.on_evicted)
        self.servers: list[asyncio.Server | Listener] = []
        self._stop = asyncio.Event()
        self._lifespan: Lifespan | None = None

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve in a new event loop until stopped (see :meth:`serve`)."""
        asyncio.run(self.serve(sockets))

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        """Start, serve until a stop is asked, then shut down gracefully.

        Args:
            sockets: Listening sockets to serve (a worker: the supervisor's) instead of
                binding ``config.host:config.port``.
        """
        self._loop = loop = asyncio.get_running_loop()
        _log.info("Started server process [%d]", os.getpid())
        self._stop = asyncio.Event()
        if self.should_exit:
            self._stop.set()
        handled: list[signal.Signals] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.handle_exit, sig)
                handled.append(sig)
        try:
            await self.startup(sockets)
            if not self.started:
                return
            while not self.should_exit:
                await self._wait_for_stop()
            await self.shutdown()
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    async def _wait_for_stop(self) -> None:
        # Polled too: tests and the drain set should_exit from outside the loop.
        try:
            await asyncio.wait_for(self._stop.wait(), 0.1)
        except TimeoutError:
            pass

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Run the lifespan start-up and listen, accepting :data:`ACCEPTS_PER_WAKEUP`
        connections per readiness with a kernel queue of :data:`LISTEN_BACKLOG`; then
        :func:`freeze_startup_heap` and handle SIGHUP (a reload on the event loop).

        A failure (the lifespan, a port in use) leaves :attr:`started` false and
        :attr:`failure` naming it.
        """
        loop = asyncio.get_running_loop()
        config = self.config
        if config.lifespan:
            self._lifespan = Lifespan(config.app)
            if not await self._lifespan.startup():
                self.failure = self._lifespan.failure
                return
            self.context.state = self._lifespan.state
        context = self.context
        try:
            tls = config.tls()
            # Both kinds of listener accept ACCEPTS_PER_WAKEUP connections per readiness.
            # asyncio uses create_server's backlog both for that and for listen(): its servers
            # are created with the accept count, then every listening socket is given the
            # kernel queue below (Linux updates the backlog of a listening socket in place).
            factory = functools.partial(ServerProtocol, context)
            if tls is None:
                # Plain HTTP: our own accept and transports (gateway.h1.transport), about half
                # the CPU per new connection of asyncio's.
                for sock in sockets if sockets is not None else _bind(config.host, config.port):
                    self.servers.append(listen_plain(loop, sock, factory, ACCEPTS_PER_WAKEUP))
            elif sockets is not None:
                for sock in sockets:
                    self.servers.append(await loop.create_server(
                        factory, sock=sock, ssl=tls, backlog=ACCEPTS_PER_WAKEUP))
            else:
                self.servers.append(await loop.create_server(
                    factory, config.host, config.port, ssl=tls, backlog=ACCEPTS_PER_WAKEUP))
        except (OSError, ssl.SSLError) as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            _log.error("%s", self.failure)
            for server in self.servers:
                server.close()
            if self._lifespan is not None:
                await self._lifespan.shutdown()
            return
        for server in self.servers:
            for listening in server.sockets:
                _listen(listening, LISTEN_BACKLOG)
        self.started = True
        _log.info("Application startup complete; serving on %s",
                  ", ".join(f"{s.getsockname()}" for srv in self.servers for s in srv.sockets))
        freeze_startup_heap()
        if self.reloader is not None and threading.current_thread() is threading.main_thread():
            held = HangupLatch.install()  # the handler until now: read after replacing it
            loop.add_signal_handler(signal.SIGHUP, self.reloader.trigger, "signal")
            if held.take():  # a SIGHUP came while starting: reload now
                self.reloader.trigger("signal")
        if self._on_started is not None:
            self._on_started()

    @property
    def port(self) -> int:
        """The port of the first listener (0 before start)."""
        for server in self.servers:
            for listening in server.sockets:
                return int(listening.getsockname()[1])
        return 0

    async def shutdown(self) -> None:
        """Stop accepting, close idle connections, let requests in progress end (within
        ``timeout_graceful_shutdown``, or at once on a second stop), then the lifespan
        shutdown."""
        for server in self.servers:
            server.close()
        connections = self.context.connections
        for connection in list(connections):
            connection.shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout_graceful_shutdown
        while connections and not self.force_exit and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for connection in list(connections):
            connection.abort()
        if connections:
            await asyncio.sleep(0)
        if self._lifespan is not None:
            await self._lifespan.shutdown()

    def request_exit(self) -> None:
        """Stop serving (from the event loop's thread)."""
        self.should_exit = True
        self._stop.set()

    def handle_exit(self, sig: int) -> None:
        """SIGTERM/SIGINT: begin the drain; a second one: stop at once. A completed drain
        exits 0 (the signal is not re-raised)."""
        if sig == signal.SIGINT and self._ignore_sigint:
            return
        if self.stopped_by is None:
            self.stopped_by = sig
        drain, loop = self.drain, self._loop
        if drain is None or loop is None:  # no drain, or not started yet: stop now
            self.force_exit = self.should_exit
            self.request_exit()
            return
        if drain.draining:
            _log.warning("second %s: stopping at once", signal.Signals(sig).name)
            self.force_exit = True
            self.request_exit()
            return
        drain.begin()
        cfg = drain.settings
        _log.info("%s: draining (readyz 503; accepting for %g s; requests end within %g s)",
                  signal.Signals(sig).name, cfg.delay_s, cfg.timeout_s)
        loop.call_later(cfg.delay_s, self._stop_accepting)
        loop.call_later(cfg.timeout_s, self._deadline)

    def _stop_accepting(self) -> None:
        self.request_exit()  # shutdown() closes the listeners and the idle connections

    def _deadline(self) -> None:
        assert self.drain is not None and self._loop is not None
        cut = self.drain.cut_open()
        if cut:
            _log.warning("drain deadline: %d request(s) still running ended", cut)
        self._loop.call_later(FINAL_WRITE_S, self._abort_stuck)

    def _abort_stuck(self) -> None:
        """Close the connections still open :data:`FINAL_WRITE_S` after the drain deadline.

        A request cut at the deadline writes its final event; to a client that stopped reading,
        that write waits for ever. Closing the connection ends the write (and the request), so
        the lifespan shutdown (the audit chain sealed) runs before the orchestrator's SIGKILL.
        """
        stuck = list(self.context.connections)
        for connection in stuck:
            connection.abort()
        if stuck:
            _log.warning("drain deadline: %d connection(s) whose client did not read the end "
                         "of its response closed", len(stuck))


def _bind(host: str | None, port: int) -> list[socket.socket]:
    """Listening sockets for every address of ``host`` (as ``loop.create_server`` binds them:
    ``SO_REUSEADDR``, IPv6 sockets ``IPV6_V6ONLY``), listening with :data:`LISTEN_BACKLOG`.

    Raises:
        OSError: ``host`` does not resolve, or an address cannot be bound (``error while
            attempting to bind on address ('127.0.0.1', 8000): address already in use``, as
            asyncio words it).
    """
    infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0,
                               socket.AI_PASSIVE)
    bound: list[socket.socket] = []
    seen: set[tuple[int, Any]] = set()
    try:
        for family, type_, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, type_, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:  # named as loop.create_server names it (the CLI's hint)
                raise OSError(exc.errno, f"error while attempting to bind on address "
                              f"{address!r}: {str(exc.strerror).lower()}") from None
            sock.listen(LISTEN_BACKLOG)
    except OSError:
        for sock in bound:
            sock.close()
        raise
    return bound


def _listen(listening: Any, backlog: int) -> None:
    """``listen(backlog)`` on a serving socket (asyncio hands out a wrapper without
    ``listen``: a duplicate of its descriptor is the same socket)."""
    dup = socket.socket(listening.family, listening.type, listening.proto,
                        fileno=os.dup(listening.fileno()))
    try:
        dup.listen(backlog)
    finally:
        dup.close()


def run_server(
    config: ServerConfig, drain: Drain | None = None, reloader: Reloader | None = None, *,
    sockets: list[socket.socket] | None = None,
    on_started: Callable[[], None] | None = None,
) -> int | None:
    """Serve ``config`` in the foreground until a signal stops it.

    Args:
        config: What to serve. With ``drain``, its ``timeout_graceful_shutdown`` is set past
            the drain deadline.
        drain: Drain on SIGTERM (see :mod:`gateway.serving.drain`).
        reloader: Reload on SIGHUP (see :mod:`gateway.serving.reload`); a SIGHUP that comes before
            the server started is held (:class:`gateway.serving.hangup.HangupLatch`) and reloads
            once
            serving.
        sockets: Serve on these listening sockets (a worker: the supervisor's) instead of
            binding ``config.host:config.port``; SIGINT is then ignored (see module docstring).
        on_started: Called once serving started.

    Returns:
        The signal that stopped the server (``signal.SIGTERM``, ``signal.SIGINT``), or None
        when it stopped for another reason.

    Raises:
        CliError: ``startup_failed`` with exit status :data:`STARTUP_FAILURE` when the server
            did not start (a port in use, a lifespan start-up error such as the audit store),
            naming the reason, so the CLI's last line says why.
    """
    tune_gc()
    if drain is not None:
        # The server's own cut (tasks cancelled, no final event) only as a backstop after
        # ours, and early enough for the lifespan shutdown within SHUTDOWN_MARGIN_S: its wait
        # starts when the listener closes, delay_s after the signal.
        cfg = drain.settings
        config.timeout_graceful_shutdown = math.ceil(
            cfg.timeout_s - cfg.delay_s + FINAL_WRITE_S + 1.0)
    if reloader is not None:
        HangupLatch.install()  # held until startup() handles it
    server = GatewayServer(config, drain, reloader, on_started=on_started,
                           ignore_sigint=sockets is not None)
    server.run(sockets=sockets)
    if not server.started:
        reason = server.failure
        raise CliError(
            "startup_failed",
            f"the gateway did not start: {reason or 'see the log lines above'}",
            hint=startup_hint(reason), exit_code=STARTUP_FAILURE)
    return server.stopped_by


def startup_hint(reason: str | None) -> str:
    """The hint of a start-up failure: which setting a port in use is, else where to look."""
    if reason is None or "address already in use" in reason or "attempting to bind" in reason:
        return ("a port in use is listen.port or telemetry.admin.port; the log lines above "
                "have the details")
    return ("fix what it names and start again (`gateway check-config` checks the config "
            "file); the log lines above have the details")
