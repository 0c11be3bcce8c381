"""``gateway.h1.transport`` (our plain-TCP transport and listener) against asyncio's own.

1. A generated differential test: Hypothesis writes a script of transport calls and far-end
   actions; the script runs twice over a real loopback TCP connection, once with the accepted
   socket wrapped by :class:`SocketTransport`, once by asyncio's socket transport
   (``loop.connect_accepted_socket``, the oracle); the two normalised traces must be equal.
2. Direct tests of what a trace cannot show: when ``connection_lost`` runs, that the socket is
   closed and its descriptor left with no reader or writer, the errors ``write`` raises, and the
   :class:`Listener` (accepts per wake-up, ``close``, pausing on ``EMFILE``).
3. The gateway's server serves plain HTTP on :class:`SocketTransport` and HTTPS on asyncio's.

How a script runs. The far end ("peer") is a plain non-blocking socket the test drives. Steps
on the transport run one after another in the same turn of the loop; after a far-end step, a
"run" step, and a write while the peer reads, the test *settles*: it runs the loop and pumps the
peer until nothing changes any more. After every step the trace takes a snapshot of the
protocol's and the transport's state and of what the peer has received.

Normalisations (each is a place where asyncio's own behaviour depends on timing or on the
kernel, or where we deliberately differ from it):

* ``data_received``: the data are concatenated (how ``recv`` splits them is the kernel's).
* ``pause_writing``/``resume_writing``: compared as the paused state at each snapshot, not as a
  count. While the peer reads, how much of a write the kernel takes at once is not
  deterministic, so a large write may pause and resume within one settle, or not.
* The peer "not reading": how much a socket takes while the other end does not read is not
  deterministic either (delayed ACKs and zero-window probes let more in over hundreds of
  milliseconds), so the transport's socket is a :class:`_Gated` socket whose ``send`` takes
  nothing while the gate is closed (after reporting the socket's pending error, as a full
  socket's ``send`` would). Both transports see the same socket.
* ``eof_received``: compared as "seen". asyncio calls it again after ``resume_reading`` when it
  returned true (its reader is added back on a socket at end of stream); asyncio's documented
  protocol state machine allows it once, and :class:`SocketTransport` calls it once (checked on
  its own in ``test_eof_received_once_after_resume_reading``).
* ``connection_made``: we deliberately run it synchronously in ``SocketTransport.start()``;
  asyncio runs it from a later turn of the loop (``connect_accepted_socket`` returns after it).
  The trace starts after both have run it.
* ``connection_lost`` after ``close`` drained the buffer: asyncio calls it inside its write
  callback, we from the next turn; both are from a later step than ``close`` (snapshots after
  a settle see the same). asyncio then does not mark the connection lost, and a later
  ``write`` or ``abort`` raises ``AttributeError`` (its socket and loop are ``None``): its bug,
  not copied (we ignore both, as asyncio does after any other ``connection_lost``); the trace
  records no exception for it.
* The peer's byte count once it read a reset: a socket closed with unread data sends a reset at
  once and drops what its kernel had not sent yet, so how much of that the peer read first is
  timing ("?").
* Nagle's delay is off on both ends: asyncio sets ``TCP_NODELAY`` only when the socket's
  ``proto`` is ``IPPROTO_TCP`` (so the test's sockets are made with it, as ``create_server``'s
  are), :class:`SocketTransport` on any TCP socket.

Divergences this test found, fixed in ``gateway/h1/transport.py``: ``set_write_buffer_limits``
called ``resume_writing`` (asyncio's only ever pauses there), and ``write_eof`` after a reset
closed the connection with the ``OSError`` instead of raising it (the server's caller expects
the raise). Both are kept as explicit examples.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import select
import socket
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import gateway.serving.server as server_module
from gateway.h1 import H1Connection, RelayClient, resolver_dialer
from gateway.h1 import transport as transport_module
from gateway.h1.server import ServerProtocol
from gateway.h1.transport import Listener, SocketTransport, listen_plain
from gateway.serving.server import GatewayServer, ServerConfig
from tests.conftest import free_port, ok_app
from tests.gateway.test_gw_tls import _write_pki

_PATTERN = bytes(range(251)) * (2**20 // 251 + 2)  # period 251 (prime): offsets show


def _pattern(offset: int, n: int) -> bytes:
    """``n`` bytes of the endless pattern from stream offset ``offset``."""
    start = offset % 251
    return _PATTERN[start:start + n]


def _stream(total: int) -> bytes:
    return b"".join(_pattern(off, min(2**20, total - off)) for off in range(0, total, 2**20))


class _Gated(socket.socket):
    """A socket whose ``send`` takes nothing while ``gate_open`` is false (the far end is "not
    reading"); it still raises the socket's pending error, as ``send`` on a full socket would."""

    gate_open = True

    def send(self, data: Any, flags: int = 0, /) -> int:
        if not self.gate_open:
            super().send(b"")  # ECONNRESET, EPIPE ... as the real send would report them
            raise BlockingIOError(errno.EAGAIN, "the far end is not reading (test gate)")
        return super().send(data, flags)


def _gated(conn: socket.socket) -> _Gated:
    return _Gated(conn.family, conn.type, conn.proto, fileno=conn.detach())


def _connected_pair() -> tuple[socket.socket, socket.socket]:
    """(accepted, peer): a real TCP connection over loopback; the peer is non-blocking.

    Both without Nagle's delay: a small segment held for the peer's delayed ACK (40 ms) would
    arrive after a settle. The protocol number is given (as ``create_server`` has it from
    ``getaddrinfo``): asyncio sets ``TCP_NODELAY`` only on a socket whose ``proto`` is
    ``IPPROTO_TCP``; :class:`SocketTransport` sets it on any TCP socket.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        peer = socket.create_connection(listening.getsockname())
        accepted, _ = listening.accept()
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    peer.setblocking(False)
    return accepted, peer


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a reset (``SO_LINGER`` 0)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Recorder(asyncio.Protocol):
    """Records the callbacks; ``eof_received`` returns ``keep_open``."""

    def __init__(self, keep_open: bool = False) -> None:
        self.keep_open = keep_open
        self.events: list[str] = []
        self.data = bytearray()
        self.lost: tuple[str | None] | None = None  # (type name of the exception or None,)
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.data += data
        if self.events[-1] != "data":
            self.events.append("data")

    def eof_received(self) -> bool:
        self.events.append("eof")
        return self.keep_open

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")
        self.lost = (None if exc is None else type(exc).__name__,)

    @property
    def paused(self) -> bool:
        return self.events.count("pause") > self.events.count("resume")

    def check_order(self, eof_once: bool) -> None:
        """The protocol state machine: made first and once, lost last and at most once, pause
        and resume alternating from pause, no data after the end of stream."""
        events = self.events
        assert events[0] == "made" and events.count("made") == 1, events
        assert events.count("lost") <= 1 and ("lost" not in events or events[-1] == "lost"), events
        flow = [e for e in events if e in ("pause", "resume")]
        assert flow == ["pause", "resume"] * (len(flow) // 2) + ["pause"] * (len(flow) % 2), events
        if "eof" in events:
            assert "data" not in events[events.index("eof"):], events
        if eof_once:
            assert events.count("eof") <= 1, events


class _Peer:
    """The far end: a plain non-blocking socket, read (when ``reading``) and written by the test.

    ``end``: "open", "eof" (read end of stream), "reset" (read ECONNRESET) or "gone" (it reset
    the connection itself).
    """

    def __init__(self, sock: socket.socket, reading: bool) -> None:
        self.sock = sock
        self.reading = reading
        self.data = bytearray()
        self.end = "open"
        self.outbox = bytearray()  # what it sends that the kernel has not taken yet
        self.sent = 0
        self.shut_pending = False
        self.shut = False

    def send(self, n: int) -> None:
        if self.end == "gone" or self.shut or self.shut_pending:
            return
        self.outbox += _pattern(self.sent, n)
        self.sent += n
        self.pump()

    def shutdown(self) -> None:
        if self.end != "gone" and not self.shut:
            self.shut_pending = True
            self.pump()

    def reset(self) -> None:
        if self.end != "gone":
            _reset(self.sock)
            self.end = "gone"
            self.reading = False
            self.outbox.clear()

    def pump(self) -> None:
        if self.end == "gone":
            return
        while self.outbox:
            try:
                sent = self.sock.send(self.outbox)
            except BlockingIOError:
                break
            except OSError:  # the transport's end closed or reset the connection
                self.outbox.clear()
                break
            del self.outbox[:sent]
        if self.shut_pending and not self.outbox:
            self.shut_pending, self.shut = False, True
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        while self.reading and self.end == "open":
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                break
            except ConnectionResetError:
                self.end = "reset"
                break
            if not data:
                self.end = "eof"
                break
            self.data += data

    def close(self) -> None:
        if self.end != "gone":
            self.sock.close()


# --- the generated scripts ----------------------------------------------------------------------

_SIZE = st.one_of(st.integers(0, 64), st.integers(0, 100_000), st.integers(0, 2**20))
_LIMIT = st.none() | st.integers(0, 64) | st.integers(0, 300_000) | st.integers(0, 2**22)
_STEP = st.one_of(
    st.tuples(st.just("write"), _SIZE),
    st.tuples(st.just("writelines"), st.lists(st.integers(0, 100_000), max_size=4)),
    st.sampled_from([("pause_reading",), ("resume_reading",), ("write_eof",), ("close",),
                     ("abort",), ("run",)]),
    st.sampled_from([("peer_eof",), ("peer_block",), ("peer_drain",), ("peer_reset",)]),
    st.tuples(st.just("limits"), _LIMIT, _LIMIT),
    st.tuples(st.just("peer_send"), st.integers(1, 100_000)),
)


@dataclass(frozen=True)
class _Script:
    steps: list[tuple[Any, ...]]
    keep_open: bool  # what eof_received returns
    peer_reading: bool  # at the start


_NONE_AFTER_LOST = ("write", "writelines", "abort")
_SCRIPTS = st.builds(_Script, st.lists(_STEP, max_size=14), st.booleans(), st.booleans())


class _Run:
    """One run of a script over a fresh connection, with ``SocketTransport`` or asyncio's."""

    def __init__(self, script: _Script, ours: bool) -> None:
        self.script = script
        self.ours = ours
        self.trace: list[tuple[Any, ...]] = []
        self.written = 0  # stream offset of the next write's bytes

    async def run(self) -> list[tuple[Any, ...]]:
        loop = self.loop = asyncio.get_running_loop()
        accepted, peer_sock = _connected_pair()
        sock = self.sock = _gated(accepted)
        sock.gate_open = self.script.peer_reading
        self.peer = _Peer(peer_sock, self.script.peer_reading)
        proto = self.proto = _Recorder(self.script.keep_open)
        transport: asyncio.Transport
        if self.ours:
            ours = SocketTransport(loop, sock, proto)
            ours.start()  # connection_made now (asyncio: from a later turn)
            transport = ours
        else:
            transport = (await loop.connect_accepted_socket(lambda: proto, sock))[0]
        self.transport = transport
        self.trace.append(("start", None, self.state()))
        try:
            for step in self.script.steps:
                raised = None
                lost_before = proto.lost is not None
                try:
                    settle = self.do(step)
                except AttributeError:
                    # asyncio's bug, not copied: when its write callback runs connection_lost
                    # (close() with a buffer, drained), it does not mark the connection lost,
                    # so a later write() reaches its socket and abort() its loop, both None
                    # by then. Elsewhere asyncio ignores them after connection_lost, as we do.
                    assert not self.ours and lost_before and step[0] in _NONE_AFTER_LOST, step
                    settle = False
                except Exception as exc:
                    raised, settle = type(exc).__name__, False
                if settle:
                    await self.settle()
                self.trace.append((step, raised, self.state()))
            # The end: the peer reads again, the transport closes; wait for connection_lost.
            self.open_far_end()
            await self.settle()
            transport.close()
            await self.settle(until=lambda: proto.lost is not None)
            self.trace.append(("end", None, self.state()))
            assert sock.fileno() == -1, "the socket is closed after connection_lost"
        finally:
            if proto.lost is None:
                transport.abort()
                await asyncio.sleep(0)
            self.peer.close()
        proto.check_order(eof_once=self.ours)
        assert self.peer.data == _stream(len(self.peer.data)), "the peer got the written bytes"
        assert proto.data == _stream(len(proto.data)), "the protocol got the peer's bytes"
        return self.trace

    def open_far_end(self) -> None:
        self.sock.gate_open = True
        self.peer.reading = self.peer.end == "open"

    def do(self, step: tuple[Any, ...]) -> bool:
        """Run one step; whether to settle after it."""
        transport, peer = self.transport, self.peer
        match step:
            case ("write", n):
                data = _pattern(self.written, n)
                transport.write(data)
                self.written += n
                return peer.reading
            case ("writelines", sizes):
                chunks = []
                for n in sizes:
                    chunks.append(_pattern(self.written, n))
                    self.written += n
                transport.writelines(chunks)
                return peer.reading
            case ("limits", high, low):
                transport.set_write_buffer_limits(high, low)
            case ("pause_reading",):
                transport.pause_reading()
            case ("resume_reading",):
                transport.resume_reading()
            case ("write_eof",):
                transport.write_eof()
            case ("close",):
                transport.close()
            case ("abort",):
                transport.abort()
            case ("run",):
                return True
            case ("peer_send", n):
                peer.send(n)
                return True
            case ("peer_eof",):
                peer.shutdown()
                return True
            case ("peer_block",):  # the peer stops reading
                self.sock.gate_open = False
                peer.reading = False
            case ("peer_drain",):  # the peer reads everything from now on
                self.open_far_end()
                return True
            case ("peer_reset",):
                peer.reset()
                return True
            case _:
                raise AssertionError(step)
        return False

    def state(self) -> tuple[Any, ...]:
        proto, transport, peer = self.proto, self.transport, self.peer
        # A socket closed with unread data sends a reset at once and drops what its kernel
        # had not sent yet: how much of that the peer read first is timing ("?").
        received = "?" if peer.end == "reset" else len(peer.data)
        return (len(proto.data), "eof" in proto.events, proto.paused, proto.lost,
                transport.is_closing(), transport.is_reading(),
                transport.get_write_buffer_size(), transport.get_write_buffer_limits(),
                received, peer.end)

    def _progress(self) -> tuple[Any, ...]:
        return (len(self.proto.data), len(self.proto.events), self.proto.lost,
                self.transport.get_write_buffer_size(), len(self.peer.data), self.peer.end,
                len(self.peer.outbox), self.peer.shut)

    def _pending(self) -> bool:
        """Whether more is bound to happen: a buffer the peer takes, data (or an end) a reader
        has not read yet, bytes the peer still sends to a reading transport."""
        proto, peer, transport = self.proto, self.peer, self.transport
        peer_reads = peer.reading and peer.end == "open"
        if proto.lost is not None:
            return peer_reads and bool(select.select([peer.sock], [], [], 0)[0])
        if peer_reads and self.sock.gate_open and transport.get_write_buffer_size():
            return True
        transport_reads = transport.is_reading() and "eof" not in proto.events
        if transport_reads and peer.outbox:
            return True
        watched = [peer.sock] if peer_reads else []
        if transport_reads:
            watched.append(self.sock)
        return bool(watched and select.select(watched, [], [], 0)[0])

    async def settle(self, until: Callable[[], bool] | None = None) -> None:
        """Run the loop and pump the peer until nothing changes (at most 10 s)."""
        deadline = self.loop.time() + 10
        last: tuple[Any, ...] | None = None
        stable = 0
        while stable < 3:
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            self.peer.pump()
            await asyncio.sleep(0.001)
            now = self._progress()
            done = until is None or until()
            stable = stable + 1 if now == last and done and not self._pending() else 0
            last = now
            assert self.loop.time() < deadline, f"did not settle: {now}"


def _trace(script: _Script, ours: bool) -> list[tuple[Any, ...]]:
    return asyncio.run(_Run(script, ours).run())


@settings(max_examples=500, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_SCRIPTS)
# Divergences this test found in SocketTransport, fixed there:
# set_write_buffer_limits called resume_writing (asyncio's only pauses) ...
@example(_Script([("write", 200_000), ("limits", 1_000_000, None), ("peer_drain",)],
                 keep_open=False, peer_reading=False))
# ... and write_eof after a reset closed the connection instead of raising ENOTCONN.
@example(_Script([("pause_reading",), ("peer_reset",), ("write_eof",)], keep_open=False,
                 peer_reading=True))
# The normalisations above, each reached:
@example(_Script([("write", 1), ("peer_eof",), ("peer_drain",), ("write", 1), ("abort",)],
                 keep_open=False, peer_reading=False))  # asyncio's AttributeError
@example(_Script([("writelines", [16385]), ("peer_drain",), ("write", 524), ("write", 1)],
                 keep_open=False, peer_reading=False))  # Nagle's delay
@example(_Script([("write", 277_385), ("close",), ("peer_send", 99_999), ("peer_drain",)],
                 keep_open=False, peer_reading=False))  # a reset drops unsent bytes
@example(_Script([("peer_send", 10), ("peer_eof",), ("pause_reading",), ("resume_reading",),
                  ("run",), ("write", 5)], keep_open=True, peer_reading=True))  # eof twice
# Pausing and resuming around the marks, a close with a buffer, an abort dropping it.
@example(_Script([("limits", 100, 10), ("write", 101), ("write", 50), ("peer_drain",),
                  ("peer_block",), ("write", 2**20), ("close",), ("write", 7), ("peer_drain",)],
                 keep_open=False, peer_reading=False))
@example(_Script([("write", 70_000), ("abort",), ("peer_drain",)], keep_open=False,
                 peer_reading=False))
def test_socket_transport_traces_equal_asyncios(script: _Script) -> None:
    assert _trace(script, ours=True) == _trace(script, ours=False)


# --- direct tests: what a trace cannot show -----------------------------------------------------

async def _turns(n: int = 5, wait_s: float = 0.001) -> None:
    for _ in range(n):
        await asyncio.sleep(0)
        await asyncio.sleep(wait_s)


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def _ours(loop: asyncio.AbstractEventLoop, keep_open: bool = False
          ) -> tuple[SocketTransport, _Recorder, _Gated, socket.socket]:
    accepted, peer = _connected_pair()
    sock = _gated(accepted)
    proto = _Recorder(keep_open)
    transport = SocketTransport(loop, sock, proto)
    transport.start()
    return transport, proto, sock, peer


async def _read_all(peer: socket.socket) -> bytes:
    """What the (non-blocking) peer reads until end of stream, the loop running meanwhile."""
    data = bytearray()
    deadline = time.monotonic() + 5
    while True:
        try:
            chunk = peer.recv(1 << 20)
        except BlockingIOError:
            assert time.monotonic() < deadline, "no end of stream"
            await asyncio.sleep(0.001)
            continue
        if not chunk:
            return bytes(data)
        data += chunk


_ENDINGS = ["close", "close_buffered", "abort_buffered", "eof_received_false",
            "peer_reset_read", "peer_reset_write"]


@pytest.mark.parametrize("ending", _ENDINGS)
def test_connection_lost_once_from_a_later_step_then_the_socket_is_closed(ending: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport, proto, sock, peer = _ours(loop)
        fd = sock.fileno()
        assert proto.events == ["made"]  # synchronously in start()
        expected: str | None = None
        try:
            if ending == "close":
                transport.close()
                assert proto.lost is None, "connection_lost inside close()"
            elif ending in ("close_buffered", "abort_buffered"):
                sock.gate_open = False
                transport.write(b"x" * 200_000)
                if ending == "close_buffered":
                    transport.close()
                    assert proto.lost is None, "connection_lost inside close()"
                    await _turns()
                    assert proto.lost is None, "connection_lost before the buffer was sent"
                    sock.gate_open = True
                    assert len(await _read_all(peer)) == 200_000  # all of it, then end of stream
                else:
                    transport.abort()
                    assert proto.lost is None, "connection_lost inside abort()"
                    assert transport.get_write_buffer_size() == 0
            elif ending == "eof_received_false":
                peer.shutdown(socket.SHUT_WR)
            elif ending == "peer_reset_read":
                _reset(peer)
                expected = "ConnectionResetError"
            else:  # the reset is seen by a write (reading paused)
                transport.pause_reading()
                _reset(peer)
                await _turns()
                assert proto.lost is None
                transport.write(b"after the reset")
                assert proto.lost is None, "connection_lost inside write()"
                expected = "ConnectionResetError"
            await _until(lambda: proto.lost is not None, "connection_lost")
            await _turns()
        finally:
            if ending not in ("peer_reset_read", "peer_reset_write"):
                peer.close()
        assert proto.events.count("lost") == 1 and proto.events[-1] == "lost", proto.events
        assert proto.lost == (expected,)
        assert sock.fileno() == -1, "the socket is closed after connection_lost"
        assert transport.is_closing()
        # Nothing is left registered for the descriptor (its number may be reused at once).
        assert not loop.remove_reader(fd), "a reader left registered"
        assert not loop.remove_writer(fd), "a writer left registered"
        transport.close()
        transport.abort()
        await _turns()
        assert proto.events.count("lost") == 1
        with pytest.raises(RuntimeError):
            transport.get_protocol()

    asyncio.run(main())


def test_no_stray_callbacks_on_a_reused_descriptor() -> None:
    """After the connection ends, a new socket given the same descriptor number is not read
    or written by the old transport (its reader and writer were removed)."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport, proto, sock, peer = _ours(loop)
        fd = sock.fileno()
        sock.gate_open = False
        transport.write(b"x" * 100_000)  # the writer is registered
        transport.abort()
        peer.close()
        await _until(lambda: proto.lost is not None, "connection_lost")
        accepted, other = _connected_pair()  # the lowest free numbers: fd is reused
        try:
            sockets = {accepted.fileno(): accepted, other.fileno(): other}
            assert fd in sockets, (fd, list(sockets))
            reused = sockets[fd]
            far = other if reused is accepted else accepted
            far.sendall(b"for the new owner")
            await _turns()
            reused.setblocking(False)
            assert reused.recv(100) == b"for the new owner"  # nobody else read it
            assert proto.events[-1] == "lost" and len(proto.data) == 0
        finally:
            accepted.close()
            other.close()

    asyncio.run(main())


def test_write_errors() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport, proto, _, peer = _ours(loop)
        try:
            with pytest.raises(TypeError):
                transport.write("text")  # type: ignore[arg-type]
            transport.write(b"before")
            transport.write_eof()
            with pytest.raises(RuntimeError):
                transport.write(b"after")
            with pytest.raises(RuntimeError):
                transport.writelines([b"after"])
            transport.write_eof()  # a second one is a no-op
            assert await _read_all(peer) == b"before"
            transport.close()
            await _until(lambda: proto.lost is not None, "connection_lost")
        finally:
            peer.close()
        assert proto.lost == (None,)

    asyncio.run(main())


def test_eof_received_once_after_resume_reading() -> None:
    """``eof_received`` returned true: reading stops; a later ``resume_reading`` does not read
    the end of stream again (asyncio's transport calls ``eof_received`` a second time)."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport, proto, _, peer = _ours(loop, keep_open=True)
        try:
            peer.sendall(b"last")
            peer.shutdown(socket.SHUT_WR)
            await _until(lambda: "eof" in proto.events, "eof_received")
            assert not transport.is_closing()
            transport.pause_reading()
            transport.resume_reading()
            await _turns()
            assert proto.events == ["made", "data", "eof"]
            transport.write(b"still writing")  # the write side stays open
            transport.close()
            assert await _read_all(peer) == b"still writing"
            await _until(lambda: proto.lost is not None, "connection_lost")
        finally:
            peer.close()
        assert proto.events == ["made", "data", "eof", "lost"]

    asyncio.run(main())


# --- the listener ---------------------------------------------------------------------------------

class _Listening(socket.socket):
    """A listening socket whose ``accept`` fails with ``EMFILE`` ``failures`` times first; it
    counts the calls."""

    failures = 0
    calls = 0

    def accept(self) -> tuple[socket.socket, Any]:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().accept()


class _Protocols(list[_Recorder]):
    """A protocol factory that keeps what it made."""

    def __call__(self) -> _Recorder:
        self.append(_Recorder())
        return self[-1]


def _listening() -> _Listening:
    sock = _Listening(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def _connect(port: int, n: int) -> list[socket.socket]:
    """``n`` connections the kernel completes (queued until accepted)."""
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]


def test_listener_serves_connections_with_socket_transports() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        made = _Protocols()
        listening = _listening()
        listener = listen_plain(loop, listening, made, accepts_per_wakeup=4)
        clients = _connect(listening.getsockname()[1], 3)
        try:
            await _until(lambda: len(made) == 3, "3 connections")
            assert listener.is_serving() and listener.sockets == (listening,)
            assert all(isinstance(p.transport, SocketTransport) for p in made)
            peers = {p.transport.get_extra_info("peername") for p in made if p.transport}
            assert peers == {c.getsockname() for c in clients}
            for client in clients:
                client.sendall(b"hello")
            await _until(lambda: all(p.data == b"hello" for p in made), "the data")
        finally:
            listener.close()
            for client in clients:
                client.close()
        await _until(lambda: all(p.lost is not None for p in made), "connection_lost")

    asyncio.run(main())


@pytest.mark.parametrize("per_wakeup", [1, 8])
def test_listener_accepts_per_wakeup(per_wakeup: int) -> None:
    """With 6 connections pending, ``accepts_per_wakeup`` accepts per readiness at most."""
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        made = _Protocols()
        listening = _listening()
        clients = _connect(listening.getsockname()[1], 6)  # pending before the listener reads
        listener = listen_plain(loop, listening, made, accepts_per_wakeup=per_wakeup)
        counts = [0]
        deadline = time.monotonic() + 5
        while len(made) < 6:  # one loop iteration per sleep(0)
            await asyncio.sleep(0)
            counts.append(len(made))
            assert time.monotonic() < deadline, counts
        listener.close()
        for client in clients:
            client.close()
        await _until(lambda: all(p.lost is not None for p in made), "connection_lost")
        return counts

    counts = asyncio.run(main())
    steps = [b - a for a, b in itertools.pairwise(counts)]
    if per_wakeup == 1:
        assert max(steps) == 1, counts
    else:
        assert max(steps) == 6, counts  # all in one readiness


def test_listener_close_stops_accepting_and_closes_the_socket() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        made = _Protocols()
        listening = _listening()
        fd, port = listening.fileno(), listening.getsockname()[1]
        listener = listen_plain(loop, listening, made,
                                accepts_per_wakeup=1)
        (client,) = _connect(port, 1)
        try:
            await _until(lambda: len(made) == 1, "the connection")
            listener.close()
            assert not listener.is_serving() and listener.sockets == ()
            assert listening.fileno() == -1
            assert not loop.remove_reader(fd), "the listener's reader left registered"
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
            # The open connection stays.
            client.sendall(b"still here")
            await _until(lambda: made[0].data == b"still here", "the data")
            assert made[0].lost is None
            listener.close()  # idempotent
        finally:
            client.close()
        await _until(lambda: made[0].lost is not None, "connection_lost")

    asyncio.run(main())


def test_listener_pauses_on_emfile_and_accepts_again_after_the_delay(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(transport_module, "_RETRY_ACCEPT_S", 0.2)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        made = _Protocols()
        listening = _listening()
        listening.failures = 1
        listener = listen_plain(loop, listening, made,
                                accepts_per_wakeup=8)
        (client,) = _connect(listening.getsockname()[1], 1)
        try:
            await _until(lambda: listening.calls == 1, "the failing accept")
            started = time.monotonic()
            assert not listener.is_serving() and made == []
            # Paused: the socket stays readable, yet accept is not called again (no spin).
            await _until(lambda: time.monotonic() - started > 0.1, "0.1 s")
            assert listening.calls == 1 and made == []
            await _until(lambda: len(made) == 1, "the connection, after the delay")
            assert time.monotonic() - started >= 0.15
            assert listener.is_serving()
        finally:
            listener.close()
            client.close()
        await _until(lambda: made[0].lost is not None, "connection_lost")

    with caplog.at_level(logging.ERROR, logger="gateway.h1.transport"):
        asyncio.run(main())
    assert any("accept failed" in r.getMessage() for r in caplog.records)


# --- the gateway's server -------------------------------------------------------------------------

async def _served_transports(config: ServerConfig, client_tls: ssl.SSLContext | None
                             ) -> tuple[GatewayServer, list[asyncio.Transport], bytes]:
    """Serve ``config`` in this loop; one keep-alive request; the server's transports."""
    server = GatewayServer(config)
    await server.startup()
    assert server.started, server.failure
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.port, ssl=client_tls,
            server_hostname="127.0.0.1" if client_tls else None)
        writer.write(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        body = await asyncio.wait_for(reader.readexactly(2), 5)
        connections = list(server.context.connections)
        assert all(isinstance(c, ServerProtocol) for c in connections)
        transports = [c.transport for c in connections if c.transport]
        writer.close()
    finally:
        await server.shutdown()
    return server, transports, head + body


@pytest.fixture
def no_heap_freeze(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server freezes its start-up heap (``gc.freeze``); not this test process's."""
    monkeypatch.setattr(server_module, "freeze_startup_heap", lambda: None)


def test_the_server_serves_plain_http_on_socket_transports(no_heap_freeze: None) -> None:
    config = ServerConfig(ok_app, host="127.0.0.1", port=free_port(), lifespan=False)
    server, transports, answer = asyncio.run(_served_transports(config, None))
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok")
    assert all(isinstance(s, Listener) for s in server.servers) and server.servers
    assert len(transports) == 1 and type(transports[0]) is SocketTransport


def test_the_server_serves_https_on_asyncios_transports(no_heap_freeze: None,
                                                         tmp_path: Path) -> None:
    ca, cert, key = _write_pki(tmp_path)
    config = ServerConfig(ok_app, host="127.0.0.1", port=free_port(), lifespan=False,
                          ssl_certfile=cert, ssl_keyfile=key)
    client = ssl.create_default_context(cafile=str(ca))
    server, transports, answer = asyncio.run(_served_transports(config, client))
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok")
    assert all(isinstance(s, asyncio.Server) for s in server.servers) and server.servers
    assert len(transports) == 1 and not isinstance(transports[0], SocketTransport)
    assert transports[0].get_extra_info("ssl_object") is not None


# --- the relay's upstream client ------------------------------------------------------------------

async def _client_exchange(tls: ssl.SSLContext | None, server_tls: ssl.SSLContext | None
                           ) -> tuple[bytes, int]:
    """One POST through the relay's client to a loopback replica (HTTPS with ``server_tls``);
    returns the body and how many connections the replica accepted."""
    accepted = 0

    async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await reader.readuntil(b"\r\n\r\n{}")
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(replica, "127.0.0.1", 0, ssl=server_tls)
    scheme = "https" if server_tls is not None else "http"
    url = f"{scheme}://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    client = RelayClient(resolver_dialer(), tls=tls if tls is not None else True, limit=0,
                         keep_alive_s=30.0, connect_s=5.0)
    body = b""
    try:
        for _ in range(2):  # the second request reuses the pooled connection
            resp = await client.post(url, "/v1/x", {}, b"{}")
            while piece := await resp.read():
                body += piece
            resp.release()
    finally:
        await client.close()
        server.close()
    return body, accepted


def test_the_relay_client_dials_plain_replicas_on_socket_transports(
        monkeypatch: pytest.MonkeyPatch) -> None:
    protocols: list[asyncio.BaseProtocol] = []
    start = SocketTransport.start

    def recording_start(self: SocketTransport) -> None:
        protocols.append(self.get_protocol())
        start(self)

    monkeypatch.setattr(SocketTransport, "start", recording_start)
    body, accepted = asyncio.run(_client_exchange(None, None))
    assert body == b"okok" and accepted == 1
    assert len(protocols) == 1 and type(protocols[0]) is H1Connection


def test_the_relay_client_dials_https_replicas_on_asyncios_transports(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    started: list[SocketTransport] = []
    start = SocketTransport.start

    def recording_start(self: SocketTransport) -> None:
        started.append(self)
        start(self)

    monkeypatch.setattr(SocketTransport, "start", recording_start)
    ca, cert, key = _write_pki(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    body, accepted = asyncio.run(_client_exchange(
        ssl.create_default_context(cafile=str(ca)), server_tls))
    assert body == b"okok" and accepted == 1
    assert started == []
