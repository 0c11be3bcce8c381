"""The event loop's floor: CPU per relayed SSE event of a relay that does nothing else.

Issue 29 asks for the gateway's CPU per relayed SSE event <= 2x nginx's (``bench/relay.py``,
phase (d)). This measures what an asyncio relay costs per event before any gateway code runs:
``--streams`` loopback TCP connections each get one chunk-framed SSE event every ``--itl-ms``
(from a feeder process), and the relay process hands each read to a second TCP connection
unchanged (``data_received`` -> ``transport.write``: no parsing, no scanning, no timers). Its
CPU time (user + system, ``getrusage``) over the reads is the floor any relay on that event
loop pays; ``uvloop`` is measured beside the standard loop (the gateway cannot use uvloop: the
egress check needs the ``socket.connect`` audit events uvloop does not raise, see
``gateway/serving/run.py``).

Compare the floor with ``bench/relay_profile.py --no-profile`` (gateway) and ``--nginx`` run
right after it, on the same machine and load; read the ratios, not the microseconds. The feeder
writes every stream's event at once each interval, so the relay reads many sockets per loop
iteration: the floor is a lower bound (fewer ready sockets per wake-up cost more per event).
The gateway's figure also carries each stream's set-up spread over its events.

Usage::

    .venv/bin/python bench/loop_floor.py                  # both loops, 3 rounds each
    .venv/bin/python bench/loop_floor.py --streams 512 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import socket
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

EVENT = b"data: " + b"x" * 140 + b"\n\n"
CHUNK = b"%x\r\n%b\r\n" % (len(EVENT), EVENT)
"""One SSE event of about a vLLM token's size, framed as one HTTP/1.1 chunk (bytes)."""


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of one loopback TCP connection, ``TCP_NODELAY`` on both (as the proxies)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    for end in (a, b):
        end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


def _feed(inputs: list[socket.socket], outputs: list[socket.socket], events: int,
          itl_s: float) -> None:
    """Feeder process: ``events`` rounds of one chunk per input, ``itl_s`` seconds apart;
    reads and drops what the relay writes to ``outputs``; closes the inputs at the end."""
    for out in outputs:
        out.setblocking(False)
    for _ in range(events):
        start = time.monotonic()
        for conn in inputs:
            conn.sendall(CHUNK)
        for out in outputs:
            try:
                while out.recv(1 << 16):
                    pass
            except BlockingIOError:
                pass
        time.sleep(max(0.0, itl_s - (time.monotonic() - start)))
    for conn in inputs:
        conn.close()


class _Drop(asyncio.Protocol):
    """The client side of the relay: never read here (the feeder drains its peer)."""


class _Relay(asyncio.Protocol):
    """Hand every read to ``write`` unchanged; count reads; ``done`` at EOF."""

    def __init__(self, write: Callable[[bytes], None], reads: list[int],
                 done: Callable[[], None]) -> None:
        self._write, self._reads, self._done = write, reads, done

    def data_received(self, data: bytes) -> None:
        self._reads[0] += 1
        self._write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._done()


async def _relay(inputs: list[socket.socket], outputs: list[socket.socket]) -> tuple[int, float]:
    """Relay until every input closed. Returns (reads, CPU seconds of this process)."""
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    reads, left = [0], [len(inputs)]

    def one_done() -> None:
        left[0] -= 1
        if not left[0]:
            finished.set_result(None)

    writers = [(await loop.connect_accepted_socket(_Drop, out))[0] for out in outputs]
    for conn, writer in zip(inputs, writers, strict=True):
        await loop.connect_accepted_socket(
            lambda w=writer.write: _Relay(w, reads, one_done), conn)  # type: ignore[misc]
    before = resource.getrusage(resource.RUSAGE_SELF)
    await finished
    after = resource.getrusage(resource.RUSAGE_SELF)
    for writer in writers:
        writer.close()
    return reads[0], (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _one_round(runner: Callable[[Coroutine[Any, Any, tuple[int, float]]], tuple[int, float]],
               streams: int, events: int, itl_s: float) -> float:
    """One measurement: CPU microseconds per relayed read."""
    ins = [_tcp_pair() for _ in range(streams)]
    outs = [_tcp_pair() for _ in range(streams)]
    feeder = multiprocessing.Process(
        target=_feed, args=([a for a, _ in ins], [b for _, b in outs], events, itl_s))
    feeder.start()
    for a, _ in ins:
        a.close()
    for _, b in outs:
        b.close()
    try:
        reads, cpu_s = runner(_relay([b for _, b in ins], [a for a, _ in outs]))
    finally:
        feeder.join()
        for pair in (*ins, *outs):
            for end in pair:
                end.close()
    return cpu_s / max(reads, 1) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--streams", type=int, default=256, help="concurrent streams")
    p.add_argument("--events", type=int, default=200, help="events per stream")
    p.add_argument("--itl-ms", type=float, default=20.0, help="milliseconds between events")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    args = p.parse_args(argv)
    runners: dict[str, Callable[..., tuple[int, float]]] = {"asyncio": asyncio.run}
    try:
        import uvloop
        runners["uvloop"] = uvloop.run
    except ImportError:
        print("uvloop not installed: the standard loop only", file=sys.stderr)
    results: dict[str, list[float]] = {name: [] for name in runners}
    for runner in runners.values():  # warm-up, not counted: a first round costs
        _one_round(runner, args.streams, 20, args.itl_ms / 1000.0)  # (about twice the later rounds)
    for _ in range(args.rounds):
        for name, runner in runners.items():
            results[name].append(_one_round(runner, args.streams, args.events,
                                            args.itl_ms / 1000.0))
    print(f"relay floor, {args.streams} streams x {args.events} events "
          f"{args.itl_ms:g} ms apart, {args.rounds} rounds (median)")
    for name, values in results.items():
        print(f"{name:8} {statistics.median(values):6.2f} us CPU per relayed event  "
              f"({', '.join(f'{v:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
