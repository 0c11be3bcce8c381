"""The fused per-event path of a relayed stream equals the general path, byte for byte.

Three short paths serve the usual relayed SSE event: ``H1Connection.data_received`` decodes a
read holding exactly one whole chunk itself and hands the piece to the sink, the SSE scanner
passes a chunk of whole events without a marker straight through, and the server's chunk
writer (``CHUNK_WRITER_EXTENSION``) frames and writes the event without the per-call checks of
``WRITE_NOW_EXTENSION``. Each is fed every kind of read (one chunk, several, a part, extensions,
the last chunk) and must give the same bytes, in the same order, and the same state as the
general path; the writer is checked on the production server against h11's framing.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.h1.asgi_io import CHUNK_WRITER_EXTENSION, WRITE_NOW_EXTENSION
from gateway.h1.client import H1Connection
from gateway.h1.framing import ChunkedDecoder
from gateway.relay.rewrite import SSEUsageScanner
from tests.gateway.gateway_server import Servers, connect, read_until_closed
from tests.gateway.helpers import Sim, settings
from tests.gateway.test_h1_client import OK_CHUNKED, run
from tests.gateway.test_response_framing import _dechunk

EVENTS = [b'data: {"choices":[{"delta":{"content":"%d"}}]}\n\n' % i for i in range(30)]
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":30}}\n\n'
DONE = b"data: [DONE]\n\n"


def _chunk(data: bytes, extension: bytes = b"") -> bytes:
    return b"%x%s\r\n%s\r\n" % (len(data), extension, data)


class _Transport(asyncio.Transport):
    """Takes the request; reading is never paused here (nothing is buffered)."""

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _relayed(reads: list[bytes], stop_after: int | None = None) -> tuple[bytes, int]:
    """The body bytes ``read_into`` gives (through the sink, then returned), fed as ``reads``
    after the head, and how many reads the decoder's ``feed`` saw. The sink declines the
    piece after ``stop_after`` pieces (the bytes then come back from ``read``)."""
    conn = H1Connection()
    conn.connection_made(_Transport())
    conn.send(b"GET / HTTP/1.1\r\n\r\n")
    conn.data_received(OK_CHUNKED)
    await conn.read_head()
    fed = 0
    feed = ChunkedDecoder.feed

    def counted(self: ChunkedDecoder, data: bytes, out: list[bytes]) -> None:
        nonlocal fed
        fed += 1
        feed(self, data, out)

    got: list[bytes] = []

    def sink(piece: bytes) -> bool:
        assert piece
        got.append(piece)
        return stop_after is None or len(got) <= stop_after

    ChunkedDecoder.feed = counted  # type: ignore[method-assign]
    try:
        reader = asyncio.ensure_future(conn.read_into(sink))
        await asyncio.sleep(0)  # the sink is in place
        for data in reads:
            conn.data_received(data)
        rest = await reader
        if rest is None:  # the sink stopped and nothing followed yet
            rest = await conn.read()
        while rest:
            got.append(rest)
            rest = await conn.read()
    finally:
        ChunkedDecoder.feed = feed  # type: ignore[method-assign]
    return b"".join(got), fed


def _splits(wire: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(wire)), rng.randrange(1, 12)))
    return [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]


def test_one_whole_chunk_per_read_skips_the_decoder_and_keeps_every_byte() -> None:
    async def test() -> None:
        reads = [_chunk(event) for event in EVENTS] + [b"0\r\n\r\n"]
        body, fed = await _relayed(reads)
        assert body == b"".join(EVENTS)
        assert fed == 1  # only the last chunk went through the decoder

    run(test)


@pytest.mark.parametrize("seed", range(40))
def test_any_split_of_the_wire_gives_the_same_body_in_order(seed: int) -> None:
    """Whole chunks, parts, several chunks per read, extensions and a final chunk glued to
    the last event: the fast path and the decoder take turns, and no byte is lost, doubled
    or reordered."""
    rng = random.Random(seed)  # noqa: S311 - reproducible splits, not secrets
    chunks = [_chunk(event, b";x=1" if rng.random() < 0.2 else b"") for event in EVENTS]
    reads: list[bytes] = []
    pos = 0
    while pos < len(chunks):  # runs of whole chunks (one or several per read) and cut ones
        take = rng.choice([1, 1, 1, 2, 3])
        group = b"".join(chunks[pos:pos + take])
        pos += take
        reads.extend(_splits(group, rng) if rng.random() < 0.3 else [group])
    reads[-1] += b"0\r\n\r\n"

    async def test() -> None:
        body, _ = await _relayed(reads)
        assert body == b"".join(EVENTS)

    run(test)


def test_a_sink_that_stops_on_the_fast_path_loses_nothing() -> None:
    async def test() -> None:
        reads = [_chunk(event) for event in EVENTS] + [b"0\r\n\r\n"]
        body, _ = await _relayed(reads, stop_after=5)
        assert body == b"".join(EVENTS)

    run(test)


def _scanned(pieces: list[bytes], drop: bool) -> tuple[list[bytes], SSEUsageScanner, list[bool]]:
    scanner = SSEUsageScanner(drop_usage_only=drop)
    out, boundaries = [], []
    for piece in pieces:
        out.append(scanner.feed(piece))
        boundaries.append(scanner.at_boundary)
    out.append(scanner.finish())
    return out, scanner, boundaries


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("seed", range(25))
def test_the_scanner_gives_the_same_bytes_and_state_whichever_way_events_arrive(
    drop: bool, seed: int
) -> None:
    """Event by event (the short path, but for the usage and ``[DONE]`` events) and cut
    anywhere (the general path): the same bytes to the client, the usage, the end marker and
    the data lines counted; ``at_boundary`` says whether the bytes sent end an event."""
    rng = random.Random(seed)  # noqa: S311 - reproducible splits, not secrets
    stream = [*EVENTS, b"data: x\r\n\r\n", b": comment\n\n", USAGE, DONE]
    whole = b"".join(stream)
    by_event, fast, _ = _scanned(stream, drop)
    cut, general, boundaries = _scanned(_splits(whole, rng), drop)
    expected = whole.replace(USAGE, b"") if drop else whole
    assert b"".join(by_event) == b"".join(cut) == expected
    for scanner in (fast, general):
        assert scanner.usage is not None and scanner.usage.output_tokens == 30
        assert scanner.done
    assert fast.data_events == general.data_events == len(EVENTS) + 3
    sent = b""
    for out, at_boundary in zip(cut, boundaries, strict=False):
        sent += out
        assert at_boundary == (sent == b"" or sent.endswith((b"\n\n", b"\r\n\r\n")))


# --- the chunk writer of the production server ---------------------------------------------


@pytest.fixture
def guarded() -> Iterator[Servers]:
    servers = Servers()
    yield servers
    servers.stop_all()


class _WriterApp:
    """Writes its events through the server's chunk writer (``/head``: the ``HEAD`` method,
    ``/sized``: a ``Content-Length`` body, where none is offered)."""

    def __init__(self) -> None:
        self.opened: list[bool] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        extensions = scope["extensions"]
        open_writer, write_now = extensions[CHUNK_WRITER_EXTENSION], extensions[WRITE_NOW_EXTENSION]
        assert open_writer() is None  # no response started yet
        sized = scope["path"] == "/sized"
        headers = [(b"content-type", b"text/event-stream")]
        if sized:
            headers.append((b"content-length", b"%d" % len(b"".join(EVENTS))))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        write = open_writer()
        self.opened.append(write is not None)
        for event in EVENTS:
            if write is not None:
                assert write(event)
            elif not write_now(event):  # HEAD: not written here (the server drops it)
                await send({"type": "http.response.body", "body": event, "more_body": True})
        assert write is None or write(b"")  # only asks
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def test_the_chunk_writer_frames_as_h11_with_the_held_head_in_front(
    guarded: Servers, sim: Sim
) -> None:
    app = _WriterApp()
    srv = guarded.start(settings([sim.url]), app=app)
    with connect(srv.port) as sock:
        sock.sendall(b"GET /events HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        raw, closed = read_until_closed(sock, timeout_s=10)
    assert closed and app.opened == [True]
    head, body = _dechunk(raw)
    assert head.startswith(b"HTTP/1.1 200 ")
    assert body == b"".join(EVENTS)
    assert raw.endswith(b"".join(_chunk(event) for event in EVENTS) + b"0\r\n\r\n")


@pytest.mark.parametrize("method, path", [("HEAD", "/events"), ("GET", "/sized")])
def test_no_chunk_writer_for_a_head_request_or_a_sized_body(
    guarded: Servers, sim: Sim, method: str, path: str
) -> None:
    app = _WriterApp()
    srv = guarded.start(settings([sim.url]), app=app)
    with connect(srv.port) as sock:
        sock.sendall(b"%s %s HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
                     % (method.encode(), path.encode()))
        raw, closed = read_until_closed(sock, timeout_s=10)
    assert closed and app.opened == [False]
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert body == (b"" if method == "HEAD" else b"".join(EVENTS))
