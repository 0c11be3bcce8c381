"""The relay's upstream client (gateway.h1) against a hostile or broken replica.

Each test runs a real loopback server that misbehaves in one way: bytes on a pooled connection
that no request asked for, a head dribbled byte by byte, a status code outside HTTP's range,
and a request waiting for a pool slot that leaves just as it is handed one. What the client must
do: refuse or drop the connection, never hang, never hand the bytes to another request.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.h1 import ProtocolError
from gateway.h1.client import HIGH_WATER, H1Connection
from gateway.h1.framing import MAX_HEAD_BYTES
from tests.gateway.helpers import KEY_A, settings, start_gateway
from tests.gateway.test_h1_client import Backend, RawBackend, client, read_all, replies, run

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


@pytest.mark.parametrize("unsolicited", [
    b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nevil",  # an answer to a request not sent yet
    b"x" * (HIGH_WATER + 1024),  # enough bytes to pause reading
], ids=["response", "flood"])
def test_bytes_on_an_idle_pooled_connection_close_it(unsolicited: bytes) -> None:
    async def test() -> None:
        released = asyncio.Event()

        async def answer(n: int, writer: asyncio.StreamWriter) -> bool:
            if backend.connections == 1:
                writer.write(OK)
                await writer.drain()
                await released.wait()  # the connection is idle in the pool now
                writer.write(unsolicited)
                return True
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nsecond")
            return True

        backend = Backend(answer)
        url = await backend.start()
        c = client()
        assert await read_all(c, url) == (200, b"ok")
        assert c.idle_connections() == 1
        released.set()
        async with asyncio.timeout(5):
            await backend.closed.wait()  # the client dropped the connection at once
        assert c.idle_connections() == 0
        async with asyncio.timeout(5):
            assert await read_all(c, url) == (200, b"second")
        assert backend.connections == 2
        await c.close()
        await backend.stop()

    run(test)


def test_a_waiter_that_leaves_as_it_is_woken_passes_the_slot_on() -> None:
    """limit=1: the slot freed by the first request goes to the third when the second leaves."""

    async def test() -> None:
        backend = Backend(lambda n, writer: _write(writer, OK))
        url = await backend.start()
        c = client(limit=1)
        resp = await c.post(url, "/v1/x", {}, b"{}")
        assert await resp.read() == b"ok" and await resp.read() == b""
        second = asyncio.create_task(read_all(c, url))
        third = asyncio.create_task(read_all(c, url))
        for _ in range(5):  # both are waiting for the one connection
            await asyncio.sleep(0)
        resp.release()  # wakes the second ...
        second.cancel()  # ... which leaves before it runs (a client gone, a deadline passed)
        with pytest.raises(asyncio.CancelledError):
            await second
        async with asyncio.timeout(5):
            assert await third == (200, b"ok")
        assert backend.connections == 1
        await c.close()
        await backend.stop()

    run(test)


async def _write(writer: asyncio.StreamWriter, data: bytes) -> bool:
    writer.write(data)
    return True


@pytest.mark.parametrize("status_line", [
    b"HTTP/1.1 600 Custom", b"HTTP/1.1 999 Custom", b"HTTP/1.1 200 O\x00K", b"HTTP/1.1 200 O\x7fK",
], ids=["600", "999", "nul-in-reason", "del-in-reason"])
def test_status_outside_http_or_control_in_reason_is_refused(status_line: bytes) -> None:
    async def test() -> None:
        backend = Backend(replies(status_line + b"\r\ncontent-length: 2\r\n\r\n{}"))
        url = await backend.start()
        c = client()
        with pytest.raises(ProtocolError, match="malformed status line"):
            await c.post(url, "/v1/x", {}, b"{}")
        await c.close()
        await backend.stop()

    run(test)


def test_status_outside_http_reaches_the_client_as_an_openai_error(
    serve_asgi: Callable[..., Any],
) -> None:
    """Relayed as is, status 999 broke the client's response (a bare disconnect)."""
    backend = RawBackend(b"HTTP/1.1 999 Custom\r\ncontent-type: application/json\r\n"
                         b"content-length: 2\r\n\r\n{}")
    try:
        url = start_gateway(serve_asgi, settings([backend.url]))
        r = httpx.post(url + "/v1/chat/completions", timeout=10,
                       headers={"authorization": f"Bearer {KEY_A}"},
                       json={"model": "llama-3.1-8b",
                             "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "upstream_error"
        assert "malformed HTTP response" in r.json()["error"]["message"]
    finally:
        backend.stop()


def test_http10_keep_alive_response_with_a_transfer_coding_is_not_pooled() -> None:
    """RFC 9112 6.1: such a message's framing is faulty; the connection is closed after it."""

    async def test() -> None:
        backend = Backend(replies(b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\n"
                                  b"transfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"))
        url = await backend.start()
        c = client()
        assert await read_all(c, url) == (200, b"ok")
        assert c.idle_connections() == 0
        assert await read_all(c, url) == (200, b"ok")
        assert backend.connections == 2
        await c.close()
        await backend.stop()

    run(test)


def test_a_head_dribbled_byte_by_byte_costs_linear_time() -> None:
    """A replica that sends its head one byte per segment (slow loris) must not make the
    client copy and rescan the whole head on every byte (64 KiB: 1.5 s of CPU, quadratic)."""
    head = (b"HTTP/1.1 200 OK\r\nx-pad: " + b"a" * (MAX_HEAD_BYTES - 64)
            + b"\r\ncontent-length: 2\r\n\r\n")

    async def test() -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        conn = H1Connection()
        await loop.connect_accepted_socket(lambda: conn, sock=ours)
        conn.send(b"POST / HTTP/1.1\r\n\r\n")
        start = time.process_time()
        for i in range(len(head)):  # what the protocol sees of a one-byte-per-segment replica
            conn.data_received(head[i:i + 1])
        spent = time.process_time() - start
        conn.data_received(b"ok")
        assert (await conn.read_head()).status == 200 and await conn.read() == b"ok"
        conn.abort()
        theirs.close()
        assert spent < 0.5, f"{spent:.2f} s of CPU for a {len(head)}-byte head"

    run(test)


def test_interim_and_final_heads_split_anywhere_parse_alike() -> None:
    wire = (b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"
            b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: b\r\n\r\nhello")

    async def test() -> None:
        loop = asyncio.get_running_loop()
        for cut in range(1, len(wire)):
            for second in (cut, min(cut + 7, len(wire))):
                ours, theirs = socket.socketpair()
                conn = H1Connection()
                await loop.connect_accepted_socket(lambda c=conn: c, sock=ours)
                conn.send(b"POST / HTTP/1.1\r\n\r\n")
                for piece in (wire[:cut], wire[cut:second], wire[second:]):
                    if piece:
                        conn.data_received(piece)
                head = await conn.read_head()
                assert (head.status, head.headers["x-a"]) == (200, "b"), cut
                assert await conn.read() == b"hello" and conn.body_done
                conn.abort()
                theirs.close()

    run(test)


def test_making_room_at_the_limit_closes_one_idle_connection_not_all() -> None:
    async def test() -> None:
        a, b = Backend(replies(OK)), Backend(replies(OK))
        url_a, url_b = await a.start(), await b.start()
        c = client(limit=2)
        first = await c.post(url_a, "/v1/x", {}, b"{}")
        assert await read_all(c, url_a) == (200, b"ok")  # a second connection to A
        assert await first.read() == b"ok" and await first.read() == b""
        first.release()
        assert c.idle_connections() == 2 and c.open_connections == 2
        async with asyncio.timeout(5):
            assert await read_all(c, url_b) == (200, b"ok")  # room made for B: one of A's
        assert c.idle_connections() == 2 and c.open_connections == 2  # one of A, one of B
        await c.close()
        await a.stop()
        await b.stop()

    run(test)


@pytest.mark.parametrize("size_line", [b"5;a\nb", b"5;a\x00b", b"5;\rx"],
                         ids=["bare-lf", "nul", "bare-cr"])
def test_a_control_character_in_a_chunk_extension_is_refused(size_line: bytes) -> None:
    async def test() -> None:
        backend = Backend(replies(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                                  + size_line + b"\r\nhello\r\n0\r\n\r\n"))
        url = await backend.start()
        c = client()
        with pytest.raises(ProtocolError, match="malformed chunk size"):
            await read_all(c, url)
        await c.close()
        await backend.stop()

    run(test)
