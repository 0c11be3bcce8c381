"""A plain-TCP transport and listener of our own, on the event loop's public reader/writer API.

Why: asyncio's socket transport costs about twice the CPU per new connection of the same
exchange on ``loop.add_reader``/``add_writer`` (``bench/connection_floor.py``: a connection,
one request and answer, closed: 203 against 107 us, docs/benchmarks.md); a burst of new
streams opens two per stream (the client's, accepted; the replica's, dialled). The standard
path runs the accept in a task awaiting a future, and makes each transport through three
scheduled callbacks and a weak-reference registry. Here a connection is accepted and its
protocol told in the listener's callback, and a dialled socket becomes a transport in the
caller's step.

What it keeps from asyncio's ``Transport`` contract (Python 3.11 ``asyncio`` documentation,
"Transports and Protocols"), which a generated differential test holds it to with asyncio's own
transport as the oracle (``tests/gateway/test_h1_transport.py``):

* ``protocol.connection_made`` once, before any other callback; ``connection_lost`` exactly
  once, from a later step of the loop (never inside ``close``/``abort``), with ``None`` after a
  ``close`` whose buffer drained or an ``abort``, and the ``OSError`` after a failed read or
  write; the socket is closed after it.
* ``data_received`` with what ``recv`` returned (up to :data:`READ_SIZE` bytes); at end of
  stream ``eof_received``, and a close unless it returns true (then reading stops and writes
  go on). If either raises, the connection ends as after a failed read (the loop's exception
  handler told, the buffer dropped, ``connection_lost`` with the exception).
  ``eof_received`` is called once: asyncio's calls it again after a ``resume_reading``, which
  reads the end of stream a second time.
* ``write`` sends at once what the socket takes and buffers the rest; the protocol's
  ``pause_writing`` when the buffer rises above the high-water mark (64 KiB by default) and
  ``resume_writing`` when it falls to the low-water mark (a quarter of it), as asyncio's
  ``set_write_buffer_limits`` defines them; ``close`` sends what is buffered first, ``abort``
  drops it; ``write_eof`` shuts the write side once the buffer is sent.
* ``pause_reading``/``resume_reading`` stop and restart ``data_received``; both are no-ops
  when already in that state or closing.

Not here: TLS (asyncio's own transports carry HTTPS, both ways) and ``sendfile``.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import socket
from collections.abc import Callable
from typing import Any

__all__ = ["READ_SIZE", "Listener", "SocketTransport", "listen_plain"]

_log = logging.getLogger(__name__)

READ_SIZE = 256 * 1024
"""Bytes asked of one ``recv`` (asyncio's socket transport reads the same)."""

_HIGH_WATER = 64 * 1024  # asyncio's default write-buffer limits (high; low is a quarter)
_RETRY_ACCEPT_S = 1.0  # out of descriptors or memory: accept again after this (asyncio's delay)
_ACCEPT_PAUSING = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class SocketTransport(asyncio.Transport):
    """One connected, non-blocking TCP socket driven by ``loop.add_reader``/``add_writer``.

    Args:
        loop: The running event loop (a selector loop: ``add_reader`` on a socket).
        sock: A connected stream socket; the transport owns it from now on (made
            non-blocking, ``TCP_NODELAY`` set, closed after ``connection_lost``).
        protocol: An ``asyncio.Protocol``; its ``connection_made`` runs in :meth:`start`.
        extra: ``get_extra_info`` values besides ``socket``; ``sockname`` and ``peername``
            are read from the socket when first asked for, unless given here.
        prepared: ``sock`` is already non-blocking with ``TCP_NODELAY`` set (a socket the
            caller dialled that way): no system calls to set them again.
    """

    __slots__ = ("_at_eof", "_buffer", "_closing", "_eof", "_fd", "_high", "_info", "_loop",
                 "_lost", "_low", "_protocol", "_read_paused", "_sock", "_write_paused")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 protocol: asyncio.Protocol, extra: dict[str, Any] | None = None, *,
                 prepared: bool = False) -> None:
        super().__init__()
        info: dict[str, Any] = {"socket": sock}
        if extra:
            info.update(extra)
        self._info = info  # get_extra_info's (asyncio's base class keeps its own, unused here)
        if not prepared:
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._loop = loop
        self._sock: socket.socket | None = sock
        self._fd = sock.fileno()
        self._protocol: asyncio.BaseProtocol | None = protocol
        self._buffer = bytearray()
        self._closing = False
        self._lost = False  # connection_lost scheduled (or run)
        self._eof = False  # write_eof asked
        self._read_paused = False
        self._at_eof = False  # the peer's end of stream read: reading stays off
        self._write_paused = False
        self._high = _HIGH_WATER
        self._low = _HIGH_WATER // 4

    def start(self) -> None:
        """Tell the protocol (``connection_made``, now) and start reading.

        If ``connection_made`` raises, the connection ends as a fatal error (the loop's
        exception handler told, ``connection_lost`` with the exception from a later step, the
        socket closed); asyncio's transport would read on with a protocol that could not set
        itself up, and the caller here would be left with a socket nobody reads or closes.
        """
        protocol = self._protocol
        assert protocol is not None
        try:
            protocol.connection_made(self)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal(exc, "protocol.connection_made() call failed")
            return
        if not self._closing and not self._read_paused:
            self._loop.add_reader(self._fd, self._read_ready)

    # --- reading ------------------------------------------------------------------------------

    def _read_ready(self) -> None:
        sock = self._sock
        if sock is None or self._lost:
            return
        try:
            data = sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal(exc, "read")
            return
        protocol = self._protocol
        if data:
            try:
                protocol.data_received(data)  # type: ignore[union-attr]
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:  # as asyncio: a failing protocol ends the connection
                self._fatal(exc, "protocol.data_received() call failed")
            return
        self._at_eof = True
        self._loop.remove_reader(self._fd)
        try:
            keep_open = protocol.eof_received()  # type: ignore[union-attr]
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal(exc, "protocol.eof_received() call failed")
            return
        if not keep_open:
            self.close()

    def is_reading(self) -> bool:
        """Whether ``data_received`` can be called (not paused, not closing)."""
        return not self._read_paused and not self._closing

    def pause_reading(self) -> None:
        """Stop reading until :meth:`resume_reading` (no-op if paused or closing)."""
        if self._read_paused or self._closing:
            return
        self._read_paused = True
        self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        """Read again after :meth:`pause_reading` (no-op if reading or closing)."""
        if not self._read_paused or self._closing:
            return
        self._read_paused = False
        if not self._at_eof:
            self._loop.add_reader(self._fd, self._read_ready)

    # --- writing ------------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` now as far as the socket takes it; buffer the rest (bytes-like).

        Raises:
            TypeError: ``data`` is not bytes-like.
            RuntimeError: After :meth:`write_eof`.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data: expected a bytes-like object, not {type(data).__name__}")
        if self._eof:
            raise RuntimeError("Cannot call write() after write_eof()")
        if not data or self._lost:
            return
        buffer = self._buffer
        if not buffer:
            try:
                sent = self._sock.send(data)  # type: ignore[union-attr]
            except (BlockingIOError, InterruptedError):
                sent = 0
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._fatal(exc, "write")
                return
            if sent == len(data):
                return
            self._loop.add_writer(self._fd, self._write_ready)
            data = memoryview(data)[sent:]
        buffer += data
        if not self._write_paused and len(buffer) > self._high:
            self._write_paused = True
            self._call_protocol("pause_writing")

    def writelines(self, list_of_data: Any) -> None:
        """Write each bytes-like item of ``list_of_data``, joined into one send."""
        self.write(b"".join(list_of_data))

    def _write_ready(self) -> None:
        buffer, sock = self._buffer, self._sock
        if sock is None or self._lost:
            return
        try:
            sent = sock.send(buffer)
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._loop.remove_writer(self._fd)
            buffer.clear()
            self._fatal(exc, "write")
            return
        if sent:
            del buffer[:sent]
        if self._write_paused and len(buffer) <= self._low:
            self._write_paused = False
            self._call_protocol("resume_writing")
        if buffer:
            return
        self._loop.remove_writer(self._fd)
        if self._closing:
            self._schedule_lost(None)
        elif self._eof:
            self._shutdown_write()

    def can_write_eof(self) -> bool:
        """Always true: a TCP socket can shut its write side."""
        return True

    def write_eof(self) -> None:
        """Shut the write side once the buffer is sent (no-op when closing or done already).

        Raises:
            OSError: The buffer is empty and ``shutdown`` failed (ENOTCONN: the peer reset the
                connection); as asyncio, the transport stays open (``close``/``abort`` it).
        """
        if self._closing or self._eof:
            return
        self._eof = True
        if not self._buffer:
            self._sock.shutdown(socket.SHUT_WR)  # type: ignore[union-attr]

    def _shutdown_write(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)  # type: ignore[union-attr]
        except OSError as exc:
            self._fatal(exc, "shutdown")

    def get_write_buffer_size(self) -> int:
        """Bytes written but not yet taken by the socket."""
        return len(self._buffer)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        """``(low, high)`` water marks in bytes."""
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """Set the water marks (asyncio's rule: ``high`` defaults to 64 KiB, or 4x ``low``;
        ``low`` to a quarter of ``high``); ``pause_writing`` if the buffer is now above
        ``high``. As asyncio, no ``resume_writing`` here: that waits for a send to bring the
        buffer to ``low``.

        Raises:
            ValueError: ``high`` below ``low``, or either negative.
        """
        if high is None:
            high = _HIGH_WATER if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        buffered = len(self._buffer)
        if not self._write_paused and buffered > high:
            self._write_paused = True
            self._call_protocol("pause_writing")

    # --- closing ------------------------------------------------------------------------------

    def is_closing(self) -> bool:
        """Whether :meth:`close` or :meth:`abort` was called (or the connection failed)."""
        return self._closing

    def close(self) -> None:
        """Stop reading, send what is buffered, then close (``connection_lost(None)``)."""
        if self._closing:
            return
        self._closing = True
        if not self._read_paused and not self._at_eof:
            self._loop.remove_reader(self._fd)
        if not self._buffer:
            self._schedule_lost(None)

    def abort(self) -> None:
        """Close at once, dropping what is buffered (``connection_lost(None)``)."""
        self._force_close(None)

    def _force_close(self, exc: BaseException | None) -> None:
        if self._lost:
            return
        if self._buffer:
            self._buffer.clear()
            self._loop.remove_writer(self._fd)
        if not self._closing:
            self._closing = True
            if not self._read_paused and not self._at_eof:
                self._loop.remove_reader(self._fd)
        self._schedule_lost(exc)

    def _fatal(self, exc: BaseException, what: str) -> None:
        if not isinstance(exc, OSError):
            message = (f"Fatal error: {what}" if what.startswith("protocol.")
                       else f"Fatal {what} error on a socket transport")
            self._loop.call_exception_handler({
                "message": message, "exception": exc,
                "transport": self, "protocol": self._protocol})
        self._force_close(exc)

    def _schedule_lost(self, exc: BaseException | None) -> None:
        self._lost = True
        self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        protocol, sock = self._protocol, self._sock
        self._protocol = self._sock = None
        try:
            if protocol is not None:
                protocol.connection_lost(exc)  # type: ignore[arg-type]
        finally:
            if sock is not None:
                sock.close()

    def _call_protocol(self, name: str) -> None:
        try:
            getattr(self._protocol, name)()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._loop.call_exception_handler({
                "message": f"protocol.{name}() failed", "exception": exc,
                "transport": self, "protocol": self._protocol})

    # --- the rest of the Transport API --------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``socket``, ``sockname``, ``peername`` (``None`` once unknowable), or what was
        given as ``extra``; ``default`` for any other name."""
        info = self._info
        if name in info:
            return info[name]
        if name in ("sockname", "peername"):
            sock = self._sock
            try:
                value = (None if sock is None else
                         sock.getsockname() if name == "sockname" else sock.getpeername())
            except OSError:
                value = None  # reset before anyone asked: asyncio would have read it at once
            info[name] = value
            return value
        return default

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        """Hand the connection's callbacks to ``protocol``."""
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        """The protocol the callbacks go to.

        Raises:
            RuntimeError: After ``connection_lost``.
        """
        if self._protocol is None:
            raise RuntimeError("the transport is closed")
        return self._protocol

    def __repr__(self) -> str:
        state = "closing" if self._closing else "open"
        return f"<SocketTransport fd={self._fd} {state} buffered={len(self._buffer)}>"


class Listener:
    """A listening TCP socket whose connections each get a :class:`SocketTransport`.

    Args:
        loop: The running event loop.
        sock: A bound, listening stream socket (made non-blocking; closed by :meth:`close`).
        protocol_factory: Makes one protocol per accepted connection.
        accepts_per_wakeup: ``accept`` calls per readiness of the socket at most (asyncio's
            ``create_server`` uses its ``backlog`` the same way).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 protocol_factory: Callable[[], asyncio.Protocol], accepts_per_wakeup: int) -> None:
        sock.setblocking(False)
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._factory = protocol_factory
        self._accepts = max(1, accepts_per_wakeup)
        self._serving = False
        self._closed = False
        self._retry: asyncio.TimerHandle | None = None
        local = sock.getsockname()
        # Every connection's local address is the listener's unless it listens on a wildcard
        # address (then each connection reads its own, when asked): None.
        wildcard = (sock.family not in (socket.AF_INET, socket.AF_INET6)
                    or ipaddress.ip_address(local[0]).is_unspecified)
        self._sockname: Any = None if wildcard else local

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        """The listening socket (empty once closed), as ``asyncio.Server.sockets``."""
        return () if self._closed else (self._sock,)

    def start(self) -> None:
        """Accept connections from the next turn of the loop on."""
        if not self._serving and not self._closed:
            self._serving = True
            self._loop.add_reader(self._fd, self._accept_ready)

    def is_serving(self) -> bool:
        """Whether connections are being accepted."""
        return self._serving

    def close(self) -> None:
        """Stop accepting and close the listening socket (open connections stay)."""
        if self._closed:
            return
        self._closed = True
        if self._serving:
            self._serving = False
            self._loop.remove_reader(self._fd)
        if self._retry is not None:
            self._retry.cancel()
        self._sock.close()

    def _accept_ready(self) -> None:
        loop, factory = self._loop, self._factory
        for _ in range(self._accepts):
            try:
                conn, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in _ACCEPT_PAUSING:
                    # Out of descriptors or memory: stop accepting for a while rather than
                    # spin on a readable socket (asyncio does the same, for the same delay).
                    _log.error("accept failed (%s); accepting again in %.0f s",
                               exc, _RETRY_ACCEPT_S)
                    loop.remove_reader(self._fd)
                    self._serving = False
                    self._retry = loop.call_later(_RETRY_ACCEPT_S, self._resume)
                    return
                raise
            extra = {"peername": peer}
            if self._sockname is not None:
                extra["sockname"] = self._sockname
            try:
                transport = SocketTransport(loop, conn, factory(), extra)
            except OSError:  # setting the socket up failed (the client reset it): drop it
                conn.close()
                continue
            transport.start()

    def _resume(self) -> None:
        self._retry = None
        self.start()


def listen_plain(loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 protocol_factory: Callable[[], asyncio.Protocol],
                 accepts_per_wakeup: int) -> Listener:
    """Serve ``sock`` (bound and listening) with :class:`SocketTransport` connections.

    Returns the started :class:`Listener`; see it for the arguments.
    """
    listener = Listener(loop, sock, protocol_factory, accepts_per_wakeup)
    listener.start()
    return listener
