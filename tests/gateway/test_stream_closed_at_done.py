"""A client that closes its connection at a stream's ``data: [DONE]`` got the whole answer.

The official ``openai`` SDK (3.x) stops reading a stream at its ``[DONE]`` event and closes the
response there, before the chunked body's last chunk (``0\\r\\n\\r\\n``); httpx then drops the
connection. When the replica's end of the body comes a moment after ``[DONE]``, the gateway saw
the client leave mid-forward and recorded ``client_disconnect``: metrics, access log and audit
said a delivered answer was not (CI's failure of ``test_metrics_move_by_the_right_amounts``,
where the gap is the loop's scheduling). The replica here waits 0.4 s between ``[DONE]`` and
the end of its body, so every stream meets the case; the gateway runs under plain uvicorn and
under its own server, with and without an audit log (with one, ``[DONE]`` is held until the
completion is durable, so the client cannot leave first). A client that leaves *before*
``[DONE]`` is still a ``client_disconnect``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.audit import Signer, generate_key_file, write_key_pair
from gateway.config.settings import GatewaySettings
from gateway.h1.asgi_io import Responder
from gateway.telemetry import Telemetry, TelemetrySettings
from tests.gateway.gateway_server import GuardedServer
from tests.gateway.helpers import KEY_A, audit_export, settings, take_request_body

END_GAP_S = 0.4  # the replica's pause between data: [DONE] and the end of its body
TOKENS = 3


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _pause(receive: Any, seconds: float) -> None:
    """Wait ``seconds``, or less when the gateway drops the connection (``http.disconnect``)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(receive(), seconds)


async def _slow_end_replica(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A chat replica whose stream's body ends ``END_GAP_S`` after ``data: [DONE]``; it sends
    ``max_tokens`` events (:data:`TOKENS` without), and with ``"max_tokens": 99`` stops after
    its first event and never ends."""
    if scope["type"] != "http":
        return
    body, _ = await take_request_body(receive)
    req = json.loads(body)  # max_tokens: events to send (TOKENS by default)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1,
            "model": req["model"]}
    for i in range(req.get("max_tokens") or TOKENS):
        delta = {"index": 0, "delta": {"content": f"t{i}"}, "finish_reason": None}
        await send({"type": "http.response.body", "more_body": True,
                    "body": _event({**base, "choices": [delta]})})
        if req.get("max_tokens") == 99:
            await _pause(receive, 5.0)
            return
    usage = {"prompt_tokens": 5, "completion_tokens": TOKENS, "total_tokens": 5 + TOKENS}
    await send({"type": "http.response.body", "more_body": True,
                "body": _event({**base, "choices": [], "usage": usage}) + b"data: [DONE]\n\n"})
    await _pause(receive, END_GAP_S)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _outcomes(admin_port: int) -> dict[tuple[str, str], float]:
    """``sg_gateway_requests_total`` by (status, outcome)."""
    text = httpx.get(f"http://127.0.0.1:{admin_port}/metrics", timeout=5).text
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "sg_gateway_requests_total":
                k = (s.labels["http_response_status_code"], s.labels["sg_outcome"])
                out[k] = out.get(k, 0.0) + s.value
    return out


def _wait_outcomes(admin_port: int, n: int) -> dict[tuple[str, str], float]:
    deadline = time.monotonic() + 10
    while True:
        got = _outcomes(admin_port)
        if sum(got.values()) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


@pytest.fixture(params=["uvicorn", "gateway-server"])
def serve(request: pytest.FixtureRequest,
          serve_asgi: Callable[..., Any]) -> Iterator[Callable[[GatewaySettings, Any], str]]:
    """``serve(settings, app) -> url`` under plain uvicorn or the gateway's own server."""
    started: list[GuardedServer] = []

    def start(s: GatewaySettings, app: Any) -> str:
        if request.param == "uvicorn":
            return str(serve_asgi(app).url)
        srv = GuardedServer(s, app=app).start()
        started.append(srv)
        return srv.url

    yield start
    for srv in started:
        srv.stop()


@pytest.mark.parametrize("audited", [False, True], ids=["no-audit", "audit"])
def test_a_stream_closed_at_done_is_delivered(
    serve: Callable[[GatewaySettings, Any], str], serve_asgi: Callable[..., Any],
    tmp_path: Path, audited: bool, request: pytest.FixtureRequest,
) -> None:
    replica = serve_asgi(_slow_end_replica).url
    audit: dict[str, Any] = {}
    if audited:
        key, _ = write_key_pair(Signer.generate(), tmp_path / "audit.key")
        audit = {"audit": {
            "store": f"sqlite://{tmp_path / 'audit.db'}", "signing_key_file": str(key),
            "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key"))}}
    s = settings([replica], **audit)
    tel = Telemetry(TelemetrySettings(admin={"port": 0}), span_exporter=InMemorySpanExporter())
    url = serve(s, create_app(s, assemble(s, telemetry=tel)))
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0, timeout=20)
    request.addfinalizer(client.close)
    streams = 3
    t0 = time.monotonic()
    for _ in range(streams):
        stream = client.chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options={"include_usage": True})
        chunks = list(stream)  # the SDK closes the response at [DONE]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
            "t0t1t2"
        assert chunks[-1].usage is not None
    if not audited:  # the SDK left at [DONE], before the replica's end
        assert time.monotonic() - t0 < streams * END_GAP_S
    # One stream the client leaves before its [DONE] (stopped after its first event).
    with client.chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], stream=True,
            max_tokens=99) as stalled:
        next(iter(stalled))
    got = _wait_outcomes(tel.admin.port, streams + 1)
    assert got == {("200", "ok"): streams, ("200", "client_disconnect"): 1}, got
    if audited:
        done = [r["data"] for r in audit_export(f"sqlite://{tmp_path / 'audit.db'}")
                if r["type"] == "request.completed"]
        assert [d["outcome"] for d in done].count("ok") == streams, done
        assert not [r for r in audit_export(f"sqlite://{tmp_path / 'audit.db'}")
                    if r["type"] == "request.undelivered"]


def test_the_stream_ends_only_with_the_whole_done_event() -> None:
    """``Responder.stream_ended``: the body given out ends with ``data: [DONE]`` and its blank
    line, also split across chunks anywhere; ``[DONE]`` in generated text, an end line
    without its blank line, or an end kept by the sink, is no end."""

    async def run(pieces: list[bytes], room: bool = True) -> bool:
        async def send(message: Any) -> None:
            pass

        out = Responder(send, "r1", write_now=lambda data: room)
        await out.start(200, [(b"content-type", b"text/event-stream")])
        take = out.sink(lambda piece: piece)
        assert take is not None
        for piece in pieces:
            take(piece)
        return out.stream_ended()

    text = _event({"choices": [{"delta": {"content": "says data: [DONE]\n\n"}}]})
    for end in (b"data: [DONE]\n\n", b"data:[DONE]\r\n\r\n", b"data: [DONE]\r\r"):
        body = text + end
        for cut in range(1, len(body)):
            assert asyncio.run(run([body[:cut], body[cut:]])), (end, cut)
        assert not asyncio.run(run([body.rstrip(b"\r\n") + end[-1:]])), end  # one line end
        assert not asyncio.run(run([body], room=False)), end  # kept for flush: not out
    assert not asyncio.run(run([text]))


def test_a_client_that_reset_with_the_stream_unread_is_not_answered(
    serve_asgi: Callable[..., Any],
) -> None:
    """Tester's F1: a client that never reads and resets after the whole stream, ``[DONE]``
    included, was handed to its connection did not get the answer (a reset discards what its
    socket holds): ``client_disconnect``, under the gateway's own server, which tells a reset
    from a close in order. The replica sends ~30 KB of events at once into a 4 KB receive
    window."""
    replica = serve_asgi(_slow_end_replica).url
    s = settings([replica])
    tel = Telemetry(TelemetrySettings(admin={"port": 0}), span_exporter=InMemorySpanExporter())
    srv = GuardedServer(s, app=create_app(s, assemble(s, telemetry=tel))).start()
    try:
        payload = json.dumps({"model": "llama-3.1-8b", "stream": True, "max_tokens": 200,
                              "messages": [{"role": "user", "content": "hi"}]}).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", srv.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                     b"Authorization: Bearer " + KEY_A.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % len(payload) + payload)
        time.sleep(END_GAP_S / 2)  # the replica sent [DONE]; its end is still to come
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset: nothing was read
        assert _wait_outcomes(tel.admin.port, 1) == {("200", "client_disconnect"): 1}
    finally:
        srv.stop()
