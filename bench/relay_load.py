"""A lean HTTP/1.1 load generator on raw asyncio sockets (helper of ``bench/relay.py``).

It writes requests by hand and scans response bytes, so that it costs far less CPU than the
server under test: SSE events are counted by scanning for ``data:`` (a JSON payload of the
simulator never contains that text); non-streamed responses are read by ``Content-Length`` or
chunked framing (RFC 9112 §7.1) on a keep-alive connection.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

MARK = b"data:"


@dataclass
class StreamResult:
    """Outcome of one streamed request."""

    events: int
    ttft_s: float
    total_s: float
    complete: bool
    gaps_s: list[float] = field(default_factory=list)
    """Inter-event gaps in seconds as the client saw them (events read together: gap 0)."""

    @property
    def max_gap_s(self) -> float:
        return max(self.gaps_s, default=0.0)


@dataclass
class StreamTotals:
    """All streams of one phase."""

    wall_s: float
    results: list[StreamResult] = field(default_factory=list)
    client_cpu_s: float | None = None
    """CPU time of the load client, when it runs as its own process (the C client)."""

    @property
    def events(self) -> int:
        return sum(r.events for r in self.results)

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s else 0.0

    @property
    def failures(self) -> int:
        return sum(1 for r in self.results if not r.complete)


def request_bytes(host: str, path: str, body: dict[str, object], api_key: str | None,
                  keep_alive: bool) -> bytes:
    """Serialise one POST with a JSON body."""
    payload = json.dumps(body).encode()
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
    ]
    if api_key:
        lines.append(f"Authorization: Bearer {api_key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


class _Dechunker:
    """Incremental HTTP/1.1 response body decoder: head, then chunked (RFC 9112 §7.1) or raw.

    Works on whole TCP reads and costs O(chunks), not O(bytes), so the client stays lean.
    """

    def __init__(self) -> None:
        self.raw = b""
        self.in_body = False
        self.chunked = False
        self.remaining = 0
        self.skip = 0
        self.ended = False

    def feed(self, data: bytes) -> bytes:
        """Return the body bytes contained in ``data``; sets ``ended`` at the last chunk."""
        buf = self.raw + data if self.raw else data
        pos = 0
        if not self.in_body:
            idx = buf.find(b"\r\n\r\n")
            if idx < 0:
                self.raw = buf
                return b""
            self.chunked = b"transfer-encoding: chunked" in buf[:idx].lower()
            self.in_body = True
            pos = idx + 4
        if not self.chunked:
            self.raw = b""
            return buf[pos:]
        out: list[bytes] = []
        end = len(buf)
        while pos < end and not self.ended:
            if self.remaining:
                take = min(self.remaining, end - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self.remaining -= take
                if self.remaining:
                    break
                self.skip = 2
            if self.skip:
                take = min(self.skip, end - pos)
                pos += take
                self.skip -= take
                if self.skip:
                    break
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol].split(b";")[0], 16)
            pos = eol + 2
            if size == 0:
                self.ended = True
            self.remaining = size
        self.raw = buf[pos:] if not self.ended else b""
        return b"".join(out)


class _StreamCounter(asyncio.Protocol):
    """Counts SSE events of streamed responses in ``data_received`` (no coroutine per read).

    The body is de-chunked first, so events cut across HTTP chunks are still counted once.
    With ``keep_alive`` the connection carries one stream after another: when a response's
    terminating zero-length chunk arrives, the next request is written while ``take()`` grants
    more work. Otherwise the server closes the connection after one response.
    """

    def __init__(self, request: bytes, done_marker: bytes, keep_alive: bool,
                 take: Callable[[], bool], results: list[StreamResult],
                 finished: asyncio.Future[None]) -> None:
        self.request = request
        self.done_marker = done_marker
        self.keep_alive = keep_alive
        self.take = take
        self.results = results
        self.finished = finished
        self.keep = len(done_marker) + 8
        self.transport: asyncio.Transport | None = None
        self.active = False
        self._reset()

    def _reset(self) -> None:
        self.t0 = time.perf_counter()
        self.ttft = 0.0
        self.events = 0
        self.last = 0.0
        self.gaps: list[float] = []
        self.complete = False
        self.tail = b""
        self.body = _Dechunker()

    def _start(self) -> None:
        self._reset()
        self.active = True
        assert self.transport is not None
        self.transport.write(self.request)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio's: no isinstance check here
        self.transport = cast(asyncio.Transport, transport)
        self._start()

    def data_received(self, data: bytes) -> None:
        payload = self.body.feed(data)
        buf = self.tail + payload
        found = buf.count(MARK)
        if found:
            now = time.perf_counter()
            if not self.events:
                self.ttft = now - self.t0
            else:
                self.gaps.append(now - self.last)
            if found > 1:
                self.gaps.extend([0.0] * (found - 1))
            self.last = now
            self.events += found
        if not self.complete and self.done_marker in buf:
            self.complete = True
        tail = buf[-self.keep:]
        # a MARK inside the kept tail was counted already: keep only what follows it
        cut = tail.rfind(MARK)
        self.tail = tail[cut + len(MARK):] if cut >= 0 else tail
        if self.keep_alive and self.body.ended:
            self._finish_one()
            if self.take():
                self._start()
            else:
                assert self.transport is not None
                self.transport.close()

    def _finish_one(self) -> None:
        # complete = saw [DONE] and (chunked) the terminating chunk, or EOF for raw bodies
        ok = self.complete and (self.body.ended or not self.body.chunked)
        self.results.append(StreamResult(self.events, self.ttft, time.perf_counter() - self.t0,
                                         ok, self.gaps))
        self.active = False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.active:
            self._finish_one()
        if not self.finished.done():
            self.finished.set_result(None)


async def one_stream(host: str, port: int, request: bytes, done_marker: bytes = b"[DONE]"
                     ) -> StreamResult:
    """Send one streamed request on a fresh connection and count its SSE events until EOF."""
    results: list[StreamResult] = []
    await _stream_connection(host, port, request, False, lambda: False, results, done_marker)
    return results[0]


async def _stream_connection(host: str, port: int, request: bytes, keep_alive: bool,
                             take: Callable[[], bool], results: list[StreamResult],
                             done_marker: bytes = b"[DONE]") -> None:
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    transport, _ = await loop.create_connection(
        lambda: _StreamCounter(request, done_marker, keep_alive, take, results, finished),
        host, port,
    )
    try:
        await finished
    finally:
        transport.close()


async def run_streams(host: str, port: int, request: bytes, total: int, concurrency: int,
                      keep_alive: bool = False) -> StreamTotals:
    """``total`` streamed requests, ``concurrency`` at a time; returns per-stream results.

    ``request`` must say ``Connection: keep-alive`` when ``keep_alive`` is set (one connection
    per worker, reused) and ``Connection: close`` otherwise (one connection per stream).
    """
    remaining = [total]
    results: list[StreamResult] = []

    def take() -> bool:
        if remaining[0] <= 0:
            return False
        remaining[0] -= 1
        return True

    async def worker() -> None:
        while take():
            try:
                await _stream_connection(host, port, request, keep_alive, take, results)
            except OSError:
                results.append(StreamResult(0, 0.0, 0.0, False))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return StreamTotals(time.perf_counter() - t0, results)


class KeepAliveClient:
    """One persistent HTTP/1.1 connection issuing requests one after another."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self._reader, self._writer

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        """Send ``raw`` and read one response; returns (status, body)."""
        reader, writer = await self._connect()
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        idx = lower.find(b"content-length:")
        if idx >= 0:
            end = lower.index(b"\r\n", idx)
            body = await reader.readexactly(int(lower[idx + 15 : end]))
        elif b"transfer-encoding: chunked" in lower:
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(chunk[:-2])
            body = b"".join(parts)
        else:
            body = await reader.read()
            self.close()
        if b"connection: close" in lower:
            self.close()
        return status, body

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


async def run_latency(host: str, port: int, request: bytes, total: int, concurrency: int
                      ) -> list[float]:
    """``total`` non-streamed requests over ``concurrency`` keep-alive connections.

    Returns:
        Per-request latencies in seconds.

    Raises:
        RuntimeError: a response was not 200.
    """
    remaining = [total]
    latencies: list[float] = []

    async def worker() -> None:
        client = KeepAliveClient(host, port)
        try:
            while remaining[0] > 0:
                remaining[0] -= 1
                t0 = time.perf_counter()
                status, body = await client.request(request)
                latencies.append(time.perf_counter() - t0)
                if status != 200:
                    raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
        finally:
            client.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def open_idle_streams(host: str, port: int, request: bytes, count: int,
                            first_event_timeout_s: float = 60.0
                            ) -> tuple[list[asyncio.StreamWriter], int]:
    """Open ``count`` streams and wait for each one's first SSE event; keep them open.

    Returns:
        The open connections (close them when done) and how many saw their first event.
    """
    async def one() -> tuple[asyncio.StreamWriter | None, bool]:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            return None, False
        writer.write(request)
        seen = b""
        try:
            async with asyncio.timeout(first_event_timeout_s):
                while MARK not in seen:
                    data = await reader.read(65536)
                    if not data:
                        return writer, False
                    seen += data
        except TimeoutError:
            return writer, False
        return writer, True

    sem = asyncio.Semaphore(100)  # open them in waves: no SYN flood against the backlog

    async def limited() -> tuple[asyncio.StreamWriter | None, bool]:
        async with sem:
            return await one()

    pairs = await asyncio.gather(*(limited() for _ in range(count)))
    writers = [w for w, _ in pairs if w is not None]
    return writers, sum(1 for _, ok in pairs if ok)
