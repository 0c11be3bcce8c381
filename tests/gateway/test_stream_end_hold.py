"""The held end of a relayed stream: only the ``data: [DONE]`` line starts the hold, and the
hold is bounded.

With an observer that must record a request's completion first (the audit log's
``end_recorded``), the responder holds back the event that ends an SSE stream and all that
follows until the record is written. Generated text that contains ``[DONE]`` (inside an event's
JSON) is no end: it held the rest of the stream until the replica finished (the client saw
nothing more, and the gateway kept every later byte). A replica that streams on after the real
end had every further byte held too (300 MiB after ``[DONE]``: the gateway's RSS grew by 306 MB).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.h1.asgi_io import MAX_HELD_AFTER_END, HeldEndTooLong, Message, Responder
from gateway.relay.records import RequestRecord
from tests.gateway.gateway_server import Servers
from tests.gateway.helpers import KEY_A, Recorder, settings, sse_events
from tests.gateway.test_h1_client import OK_CHUNKED

AUTH = {"authorization": f"Bearer {KEY_A}"}
CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "stream": True}
SSE_HEAD = [(b"content-type", b"text/event-stream")]


def event(content: str) -> bytes:
    delta = {"choices": [{"index": 0, "delta": {"content": content}}]}
    return b"data: " + json.dumps(delta).encode() + b"\n\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Client:
    """A server's ``send`` and ``write_now``: what left at once, and what was sent later."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.sent: list[Message] = []

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def write_now(self, data: bytes) -> bool:
        if data:
            self.written.append(data)
        return True


async def _relay(pieces: list[bytes], path: str) -> tuple[bytes, bytes]:
    """``pieces`` through a holding responder: (bytes that left at once, bytes held)."""
    client = _Client()
    out = Responder(client.send, "r1", hold_end=True, write_now=client.write_now)
    await out.start(200, list(SSE_HEAD))
    take = out.sink(lambda piece: piece)
    assert take is not None
    for piece in pieces:
        if path == "sink":
            take(piece)
        else:
            await out.body(piece)
    before = len(client.sent)
    now = b"".join(client.written) + b"".join(m.get("body", b"") for m in client.sent)
    await out.release(True)
    later = b"".join(m.get("body", b"") for m in client.sent[before:])
    return now, later


@pytest.mark.parametrize("path", ["body", "sink"])
def test_done_in_generated_text_does_not_hold_the_stream(path: str) -> None:
    """Events whose text says ``[DONE]`` (also split across pieces anywhere) go out at once;
    the real end line is held, with LF, CRLF or CR line ends and with or without the space."""
    text = event("the stream ends with data: [DONE] and then") + event(" more [DONE]")
    for end in (b"data: [DONE]\n\n", b"data:[DONE]\r\n\r\n", b"data: [DONE]\r\r"):
        for line_end in (b"\n\n", b"\r\n\r\n", b"\r\r"):
            body = text.replace(b"\n\n", line_end) + end
            marker_end = body.index(b"[DONE]", len(body) - len(end)) + len(b"[DONE]")
            for cut in range(1, len(body)):
                now, later = asyncio.run(_relay([body[:cut], body[cut:]], path))
                # The piece that completes the end line, and all after it, is held.
                expected = (body[:cut], body[cut:]) if cut < marker_end else (b"", body)
                assert (now, later) == expected, cut


def test_the_first_event_of_a_stream_can_be_its_end() -> None:
    now, later = asyncio.run(_relay([b"data: [DONE]\n\n"], "sink"))
    assert (now, later) == (b"", b"data: [DONE]\n\n")


class _EndGate(Recorder):
    """An observer that must record a request's end before the client sees it (as the audit
    log does), so the relay holds the end of each response."""

    def end_recorded(self, record: RequestRecord) -> bool:
        return True


class _Replica:
    """Streams an event saying ``[DONE]``, waits (bounded) until the test saw it arrive at the
    client, then ends the stream; :attr:`seen_in_time` tells whether it did."""

    def __init__(self) -> None:
        self.seen = threading.Event()
        self.seen_in_time: bool | None = None
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                conn.sendall(OK_CHUNKED + chunk(event("say [DONE]")))
                self.seen_in_time = self.seen.wait(5)
                conn.sendall(chunk(event("!") + b"data: [DONE]\n\n") + b"0\r\n\r\n")
                while conn.recv(65536):
                    pass

    def stop(self) -> None:
        self.sock.close()


@pytest.fixture
def guarded() -> Iterator[Servers]:
    servers = Servers()
    yield servers
    servers.stop_all()


def test_a_stream_whose_text_says_done_reaches_the_client_as_it_is_generated(
    guarded: Servers,
) -> None:
    replica = _Replica()
    s = settings([replica.url])
    gw = guarded.start(s, create_app(s, observers=[_EndGate()])).url
    received = b""
    try:
        with httpx.stream("POST", gw + "/v1/chat/completions", json=CHAT, headers=AUTH,
                          timeout=30) as r:
            for piece in r.iter_raw():
                received += piece
                if b"say [DONE]" in received:
                    replica.seen.set()
    finally:
        replica.stop()
    assert replica.seen_in_time, "the event saying [DONE] was held until the stream ended"
    events = sse_events(received)
    assert [e if e == "[DONE]" else e["choices"][0]["delta"]["content"] for e in events] == [
        "say [DONE]", "!", "[DONE]"]


@pytest.mark.parametrize("path", ["body", "sink"])
def test_what_follows_the_end_is_held_up_to_a_bound(path: str) -> None:
    """A held end takes a few more bytes; a second stream after ``data: [DONE]`` raises
    instead of being held whole (it is not counted as sent)."""

    async def test() -> None:
        client = _Client()
        out = Responder(client.send, "r1", hold_end=True, write_now=client.write_now)
        await out.start(200, list(SSE_HEAD))
        take = out.sink(lambda piece: piece)
        assert take is not None
        write = take if path == "sink" else out.body
        filler = event("x" * 64_000)
        for piece in (event("a") + b"data: [DONE]", b"\n\n", event("late")):
            await _call(write, piece)
        sent = 0
        with pytest.raises(HeldEndTooLong, match="after the end of the stream"):
            while sent <= MAX_HELD_AFTER_END:
                await _call(write, filler)
                sent += len(filler)
        assert out.bytes_out == len(event("a") + b"data: [DONE]\n\n" + event("late")) + sent
        await out.body(b"data: {}\n\n", more=False)  # the end (an error event) is still held
        await out.release(True)
        assert client.written == []

    asyncio.run(test())


async def _call(write: Any, piece: bytes) -> None:
    result = write(piece)
    if asyncio.iscoroutine(result):
        await result


class _Flood:
    """Ends its stream with ``data: [DONE]``, then sends ``after`` more bytes of events."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                conn.sendall(OK_CHUNKED + chunk(event("hi") + b"data: [DONE]\n\n"))
                piece = chunk(event("y" * 4000))
                for _ in range(self.after // len(piece)):
                    conn.sendall(piece)
                conn.sendall(b"0\r\n\r\n")
                while conn.recv(65536):
                    pass

    def stop(self) -> None:
        self.sock.close()


def test_a_replica_that_streams_on_after_its_end_is_cut_and_audited_as_failed(
    guarded: Servers,
) -> None:
    replica = _Flood(after=MAX_HELD_AFTER_END + (2 << 20))
    recorder = _EndGate()
    s = settings([replica.url])
    gw = guarded.start(s, create_app(s, observers=[recorder])).url
    try:
        r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH, timeout=30)
    finally:
        replica.stop()
    assert r.status_code == 200
    assert len(r.content) < MAX_HELD_AFTER_END + (1 << 20)  # not all that followed
    events = sse_events(r.content)
    assert events[:2] == [event_json("hi"), "[DONE]"]
    assert events[-1]["error"]["code"] == "upstream_error"
    assert "after the end of the stream" in events[-1]["error"]["message"]
    record = recorder.wait(1)[0]
    assert (record.outcome, record.error_code) == ("upstream_error", "upstream_error")


def event_json(content: str) -> Any:
    return json.loads(event(content)[len(b"data: "):])


@pytest.mark.parametrize("path", ["body", "sink"])
@pytest.mark.parametrize("last", ["response.completed", "response.failed", "response.incomplete"])
def test_the_last_event_of_a_responses_stream_is_held(path: str, last: str) -> None:
    """A Responses API stream (``/v1/responses``) ends with its ``response.completed`` event
    (the whole answer and its usage), without ``[DONE]``: that event is held, however split;
    the same name in generated text is not."""
    text = (b"event: response.output_text.delta\n"
            b'data: {"type":"response.output_text.delta","delta":"event: response.completed"}\n\n')
    end = (b"event: " + last.encode() + b"\n"
           b'data: {"type":"' + last.encode() + b'","response":{"usage":{"output_tokens":1}}}\n\n')
    body = text + end
    marker_end = len(text) + len(b"event: " + last.encode() + b"\n")
    for cut in range(1, len(body)):
        now, later = asyncio.run(_relay([body[:cut], body[cut:]], path))
        expected = (body[:cut], body[cut:]) if cut < marker_end else (b"", body)
        assert (now, later) == expected, cut


@pytest.mark.parametrize("path", ["body", "sink"])
def test_a_large_responses_end_event_is_held_whole(path: str) -> None:
    """The ``response.completed`` event carries the whole answer (here 1 MiB, arriving in
    16 KiB pieces after its event line): all of it is held and released, not cut."""

    async def test() -> None:
        client = _Client()
        out = Responder(client.send, "r1", hold_end=True, write_now=client.write_now)
        await out.start(200, list(SSE_HEAD))
        take = out.sink(lambda piece: piece)
        assert take is not None
        write = take if path == "sink" else out.body
        data = b'data: {"type":"response.completed","response":{"text":"' + b"y" * (1 << 20)
        body = b"event: response.created\ndata: {}\n\nevent: response.completed\n" + data
        body += b'"}}\n\n'
        for i in range(0, len(body), 16384):
            await _call(write, body[i:i + 16384])
        await out.body(b"", more=False)
        await out.release(True)
        assert b"".join(client.written) + b"".join(
            m.get("body", b"") for m in client.sent) == body

    asyncio.run(test())
