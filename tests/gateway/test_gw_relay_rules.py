"""Each relay rule (gateway.relay.pipeline), tested so that it fails if the rule breaks."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.errors import ServiceUnavailable
from gateway.relay.records import RequestRecord
from gateway.telemetry import Telemetry, TelemetrySettings
from tests.conftest import free_port
from tests.gateway.gateway_server import Servers
from tests.gateway.helpers import (
    BACKEND_KEY,
    KEY_A,
    KEY_B,
    Clients,
    Recorder,
    Sim,
    settings,
    sse_events,
    start_gateway,
    start_sim,
)

MESSAGES: Any = [{"role": "user", "content": "hi"}]
CHAT = {"model": "llama-3.1-8b", "messages": MESSAGES}
AUTH_A = {"authorization": f"Bearer {KEY_A}"}


def wait_for(pred: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


# --- credentials and headers -------------------------------------------------------------


def test_client_credentials_never_reach_backend(serve_asgi: Any, sim: Sim) -> None:
    gw = start_gateway(serve_asgi, settings([sim.url]))
    r = httpx.post(
        gw + "/v1/chat/completions",
        json=CHAT,
        headers={
            **AUTH_A,
            "cookie": "session=s3cr3t",
            "proxy-authorization": "Basic Zm9vOmJhcg==",
            "x-api-key": KEY_A,
            "x-forwarded-for": "203.0.113.9",
            "x-custom": "nope",
            "connection": "keep-alive, x-custom",
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        },
    )
    assert r.status_code == 200
    headers = sim.stats()["last_headers"]
    assert headers["authorization"] == f"Bearer {BACKEND_KEY}"
    for name in ("cookie", "proxy-authorization", "x-api-key", "x-forwarded-for", "x-custom"):
        assert name not in headers
    assert KEY_A not in repr(headers) and "s3cr3t" not in repr(headers)
    assert headers["traceparent"].startswith("00-0af7651916cd43dd")
    assert headers["x-request-id"] == r.headers["x-request-id"]
    assert "x-simulator" not in r.headers  # backend response headers are allow-listed too


def test_replica_without_credential_gets_no_authorization(
    serve_asgi: Any, sim: Sim, clients: Clients
) -> None:
    gw = start_gateway(serve_asgi, settings([sim.url]))
    clients(gw, KEY_B).chat.completions.create(model="other-model", messages=MESSAGES)
    headers = sim.stats()["last_headers"]
    assert "authorization" not in headers
    assert KEY_B not in repr(headers)


# --- error shapes before forwarding ------------------------------------------------------


def _shape(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    assert r.headers["x-request-id"]
    return dict(body["error"])


@pytest.fixture
def small_gw(serve_asgi: Any, sim: Sim) -> str:
    return start_gateway(serve_asgi, settings([sim.url], limits={"max_body_bytes": 1024}))


def test_401_same_body_for_every_failure(small_gw: str, sim: Sim, clients: Clients) -> None:
    url = small_gw + "/v1/chat/completions"
    bodies = []
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {KEY_A}"},
                    {"authorization": f"Bearer {KEY_A}x"}):
        r = httpx.post(url, json=CHAT, headers=headers)
        bodies.append(_shape(r, 401, "invalid_api_key"))
        assert r.headers["www-authenticate"].startswith("Bearer")
    assert all(b == bodies[0] for b in bodies)
    with pytest.raises(openai.AuthenticationError):
        clients(small_gw, "wrong").chat.completions.create(model="llama-3.1-8b", messages=MESSAGES)
    assert sim.stats()["received"] == 0


def test_403_404_400_405(small_gw: str, sim: Sim, clients: Clients) -> None:
    url = small_gw + "/v1/chat/completions"
    err = _shape(httpx.post(url, json={**CHAT, "model": "other-model"}, headers=AUTH_A),
                 403, "model_not_allowed")
    assert err["param"] == "model" and err["type"] == "permission_error"
    _shape(httpx.post(url, json={**CHAT, "model": "gpt-4"}, headers=AUTH_A),
           404, "model_not_found")
    err = _shape(httpx.post(url, content=b'{"model": "llama-3.1-8b",\n "x": }', headers=AUTH_A),
                 400, "invalid_json")
    assert "line 2 column 7 (char 32)" in err["message"]
    _shape(httpx.post(url, json={"messages": MESSAGES}, headers=AUTH_A), 400, "invalid_request")
    _shape(httpx.get(url, headers=AUTH_A), 405, "method_not_allowed")
    with pytest.raises(openai.PermissionDeniedError):
        clients(small_gw).chat.completions.create(model="other-model", messages=MESSAGES)
    with pytest.raises(openai.NotFoundError):
        clients(small_gw).chat.completions.create(model="nope", messages=MESSAGES)
    assert sim.stats()["received"] == 0


def test_413_declared_length_refused_before_reading(small_gw: str, sim: Sim) -> None:
    """Content-Length over the limit: 413 although the body was never sent."""
    port = int(small_gw.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                  b"authorization: Bearer " + KEY_A.encode() + b"\r\n"
                  b"content-type: application/json\r\ncontent-length: 50000000\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert b'"code":"request_too_large"' in data
    assert sim.stats()["received"] == 0


def test_413_streamed_body_without_length(small_gw: str, sim: Sim, clients: Clients) -> None:
    def body() -> Any:
        yield b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 200
        yield b'"}]}'

    r = httpx.post(small_gw + "/v1/chat/completions", content=body(), headers=AUTH_A)
    _shape(r, 413, "request_too_large")
    with pytest.raises(openai.APIStatusError) as info:
        clients(small_gw).chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "y" * 2000}])
    assert info.value.status_code == 413
    assert sim.stats()["received"] == 0


# --- disconnects ---------------------------------------------------------------------------


# Both servers: uvicorn's own h11 (the relay watches ``receive()`` in a task) and the gateway's
# server (gateway.h1.server: the connection calls the relay back, DISCONNECT_EXTENSION).
SERVERS = pytest.mark.parametrize("server", ["uvicorn-h11", "gateway"])


@pytest.fixture
def guarded() -> Iterator[Servers]:
    servers = Servers()
    yield servers
    servers.stop_all()


def _serve(serve_asgi: Any, guarded: Servers, server: str, s: Any, **kwargs: Any) -> str:
    if server == "gateway":
        return guarded.start(s, create_app(s, **kwargs)).url
    return start_gateway(serve_asgi, s, **kwargs)


@SERVERS
def test_stream_disconnect_cancels_upstream(serve_asgi: Any, guarded: Servers, server: str) -> None:
    sim = start_sim(serve_asgi, itl_s=0.05, tokens_per_response=400)
    gw = _serve(serve_asgi, guarded, server, settings([sim.url]))
    with httpx.stream("POST", gw + "/v1/chat/completions", json={**CHAT, "stream": True},
                      headers=AUTH_A) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert sim.stats()["running"] == 1
    closed = time.monotonic()
    assert wait_for(lambda: sim.stats()["running"] == 0, 1.0)
    assert time.monotonic() - closed < 1.0
    stats = sim.stats()
    assert stats["cancelled"] == 1 and stats["completed"] == 0


@SERVERS
def test_non_stream_disconnect_cancels_upstream(
    serve_asgi: Any, guarded: Servers, server: str
) -> None:
    sim = start_sim(serve_asgi, ttft_s=30)
    recorder = Recorder()
    gw = _serve(serve_asgi, guarded, server, settings([sim.url]), observers=[recorder])
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A, timeout=0.5)
    assert wait_for(lambda: sim.stats()["cancelled"] == 1, 1.0)
    assert sim.stats()["running"] == 0
    assert recorder.wait(1)[0].outcome == "client_disconnect"


@SERVERS
def test_disconnect_on_a_reused_connection_cancels_upstream(
    serve_asgi: Any, guarded: Servers, server: str
) -> None:
    # The first request on the connection finished and forgot its watch; the second one's
    # watch must still be called when the client goes away.
    sim = start_sim(serve_asgi, itl_s=0.05, tokens_per_response=400)
    gw = _serve(serve_asgi, guarded, server, settings([sim.url]))
    with httpx.Client(base_url=gw, headers=AUTH_A) as client:
        assert client.post("/v1/chat/completions",
                           json={**CHAT, "max_tokens": 2}).status_code == 200
        with client.stream("POST", "/v1/chat/completions",
                           json={**CHAT, "stream": True}) as r:
            lines = r.iter_lines()  # kept: a dropped line iterator closes the response
            assert next(lines).startswith("data: ")
            assert sim.stats()["running"] == 1
            r.close()
            client.close()  # the kept-alive connection itself goes
        assert wait_for(lambda: sim.stats()["running"] == 0, 1.0)
    stats = sim.stats()
    assert stats["cancelled"] == 1 and stats["completed"] == 1


# --- retries -------------------------------------------------------------------------------


def test_retry_on_connect_error(serve_asgi: Any, sim: Sim, clients: Clients) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    recorder = Recorder()
    gw = start_gateway(serve_asgi, settings([dead, sim.url]), observers=[recorder])
    for _ in range(4):
        clients(gw).chat.completions.create(model="llama-3.1-8b", messages=MESSAGES)
    assert sim.stats()["received"] == 4
    retried = [r for r in recorder.wait(4) if r.attempts == 2]
    assert len(retried) == 1 and retried[0].replica_url == sim.url
    assert all(r.outcome == "ok" for r in recorder.ended)


def test_connect_error_everywhere_is_502(serve_asgi: Any) -> None:
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    gw = start_gateway(serve_asgi, settings(dead))
    r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
    _shape(r, 502, "upstream_connect_error")
    # Backend addresses are internal network layout: the client learns which replica, not where.
    message = r.json()["error"]["message"]
    assert "llama-3.1-8b replica" in message
    assert all(u not in r.text for u in dead) and "127.0.0.1" not in r.text


def test_no_retry_after_first_byte(serve_asgi: Any, clients: Clients) -> None:
    a, b = start_sim(serve_asgi), start_sim(serve_asgi)
    for s in (a, b):
        s.fault(mode="die_mid_stream", after_events=3)
    recorder = Recorder()
    gw = start_gateway(serve_asgi, settings([a.url, b.url]), observers=[recorder])
    got = []
    with pytest.raises(openai.APIError) as info:
        for chunk in clients(gw).chat.completions.create(model="llama-3.1-8b", messages=MESSAGES,
                                                     stream=True):
            got.append(chunk)
    assert got, "events before the failure reached the client"
    assert "incomplete response" in str(info.value)
    assert a.stats()["received"] + b.stats()["received"] == 1
    rec = recorder.wait(1)[0]
    assert rec.outcome == "upstream_error" and rec.attempts == 1


def test_error_event_is_last_event(serve_asgi: Any) -> None:
    sim = start_sim(serve_asgi)
    sim.fault(mode="die_mid_stream", after_events=2)
    gw = start_gateway(serve_asgi, settings([sim.url]))
    r = httpx.post(gw + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH_A)
    assert r.status_code == 200
    events = sse_events(r.content)
    assert events[-1]["error"]["code"] == "upstream_error"
    assert all("error" not in e for e in events[:-1])


def test_429_retried_on_other_replica_and_honours_retry_after(serve_asgi: Any) -> None:
    a, b = start_sim(serve_asgi), start_sim(serve_asgi)
    a.fault(mode="status_429", retry_after_s=30)
    b.fault(mode="status_429", retry_after_s=30)
    recorder = Recorder()
    gw = start_gateway(serve_asgi, settings([a.url, b.url]), observers=[recorder])
    r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
    err = _shape(r, 429, "upstream_429")
    assert err["type"] == "rate_limit_error"
    assert r.headers["retry-after"] == "30"
    assert a.stats()["received"] == 1 and b.stats()["received"] == 1
    # Both replicas are now held back for their Retry-After.
    assert httpx.get(gw + "/readyz").status_code == 503


def test_429_short_retry_after_is_waited_out(serve_asgi: Any, clients: Clients) -> None:
    sim = start_sim(serve_asgi)
    sim.fault(mode="status_429", retry_after_s=1, count=1)
    gw = start_gateway(serve_asgi, settings([sim.url]))
    r = clients(gw).chat.completions.create(model="llama-3.1-8b", messages=MESSAGES)
    assert r.choices[0].message.content
    assert sim.stats()["received"] == 2


def test_500_is_relayed_not_retried(serve_asgi: Any, clients: Clients) -> None:
    a, b = start_sim(serve_asgi), start_sim(serve_asgi)
    a.fault(mode="status_500")
    b.fault(mode="status_500")
    gw = start_gateway(serve_asgi, settings([a.url, b.url]))
    with pytest.raises(openai.InternalServerError):
        clients(gw).chat.completions.create(model="llama-3.1-8b", messages=MESSAGES)
    assert a.stats()["received"] + b.stats()["received"] == 1


def test_backend_400_does_not_eject(serve_asgi: Any, clients: Clients) -> None:
    sim = start_sim(serve_asgi, max_model_len=8)
    gw = start_gateway(serve_asgi, settings([sim.url]))
    for _ in range(2):
        with pytest.raises(openai.BadRequestError):
            clients(gw).chat.completions.create(
                model="llama-3.1-8b", messages=[{"role": "user", "content": "word " * 50}])
    ready = httpx.get(gw + "/readyz")  # its one replica still available: not ejected
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    assert sim.stats()["received"] == 2


# --- timeouts ----------------------------------------------------------------------------


def test_first_byte_timeout_is_504(serve_asgi: Any) -> None:
    sim = start_sim(serve_asgi)
    sim.fault(mode="hang")
    gw = start_gateway(serve_asgi, settings([sim.url], timeouts={"first_byte_s": 0.3}))
    r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
    err = _shape(r, 504, "upstream_timeout")
    assert "first byte" in err["message"]
    assert wait_for(lambda: sim.stats()["running"] == 0, 1.0)


def test_idle_timeout_ends_stream_with_error_event(serve_asgi: Any) -> None:
    sim = start_sim(serve_asgi, itl_s=2.0, tokens_per_response=3)
    recorder = Recorder()
    gw = start_gateway(serve_asgi, settings([sim.url], timeouts={"idle_s": 0.3}),
                       observers=[recorder])
    r = httpx.post(gw + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH_A)
    assert r.status_code == 200
    events = sse_events(r.content)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1]["error"]["code"] == "upstream_timeout"
    assert recorder.wait(1)[0].outcome == "timeout"
    assert wait_for(lambda: sim.stats()["cancelled"] == 1, 1.0)


def test_idle_timeout_counts_from_the_last_chunk_not_the_first(serve_asgi: Any) -> None:
    # Tokens 0.1 s apart for about 1 s, idle limit 0.3 s: the deadline must move with every
    # chunk (one timer per response re-arms itself), so the whole stream is relayed.
    sim = start_sim(serve_asgi, itl_s=0.1, tokens_per_response=10)
    recorder = Recorder()
    gw = start_gateway(serve_asgi, settings([sim.url], timeouts={"idle_s": 0.3}),
                       observers=[recorder])
    r = httpx.post(gw + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH_A,
                   timeout=10)
    assert r.status_code == 200
    assert r.content.endswith(b"data: [DONE]\n\n")
    assert not any("error" in e for e in sse_events(r.content))
    assert recorder.wait(1)[0].outcome == "ok"


# --- framing faults ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["split_writes", "crlf"])
def test_framing_variants_relayed_and_accounted(
    serve_asgi: Any, mode: str, clients: Clients
) -> None:
    sim = start_sim(serve_asgi)
    sim.fault(mode=mode)
    recorder = Recorder()
    gw = start_gateway(serve_asgi, settings([sim.url]), observers=[recorder])
    r = httpx.post(gw + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH_A)
    assert r.status_code == 200
    if mode == "crlf":
        assert b"\r\n\r\n" in r.content and b"\n\n" not in r.content.replace(b"\r\n", b"")
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    assert all(e == "[DONE]" or e["choices"] for e in events)  # usage event removed
    assert "日本語" in "".join(e["choices"][0]["delta"].get("content") or ""
                              for e in events[:-1])
    assert recorder.wait(1)[0].output_tokens == 16
    chunks = list(clients(gw).chat.completions.create(
        model="llama-3.1-8b", messages=MESSAGES, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16


# --- observers and health ----------------------------------------------------------------


class Refuser:
    def __init__(self) -> None:
        self.ended: list[RequestRecord] = []

    async def on_start(self, record: RequestRecord) -> None:
        raise ServiceUnavailable("audit store unavailable")

    async def on_end(self, record: RequestRecord) -> None:
        self.ended.append(record)


def test_observer_can_refuse_before_forwarding(serve_asgi: Any, sim: Sim) -> None:
    refuser = Refuser()
    gw = start_gateway(serve_asgi, settings([sim.url]), observers=[refuser])
    r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
    _shape(r, 503, "service_unavailable")
    assert sim.stats()["received"] == 0
    assert wait_for(lambda: len(refuser.ended) == 1, 5.0)
    assert refuser.ended[0].outcome == "denied"


def test_on_start_runs_before_forwarding(serve_asgi: Any, sim: Sim, clients: Clients) -> None:
    seen: list[int] = []

    class Probe(Recorder):
        async def on_start(self, record: RequestRecord) -> None:
            async with httpx.AsyncClient() as c:
                seen.append((await c.get(sim.url + "/sim/stats")).json()["received"])

    gw = start_gateway(serve_asgi, settings([sim.url]), observers=[Probe()])
    clients(gw).chat.completions.create(model="llama-3.1-8b", messages=MESSAGES)
    assert seen == [0] and sim.stats()["received"] == 1


def test_active_health_marks_dead_replica(serve_asgi: Any, sim: Sim) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    s = settings([sim.url, dead], health={"active": True, "interval_s": 0.1, "timeout_s": 0.5})
    tel = Telemetry(TelemetrySettings.model_validate({"admin": {"port": 0}}))
    gw = serve_asgi(create_app(s, assemble(s, telemetry=tel))).url
    metrics = f"http://127.0.0.1:{tel.admin.port}/metrics"

    def healthy() -> dict[str, float]:  # replica URL -> sg_gateway_replica_healthy
        return {sample.labels["sg_replica"]: sample.value
                for fam in text_string_to_metric_families(httpx.get(metrics).text)
                for sample in fam.samples if sample.name == "sg_gateway_replica_healthy"}

    assert wait_for(lambda: healthy() == {sim.url: 1.0, dead: 0.0}, 3.0)
    assert httpx.get(gw + "/readyz").json() == {"status": "ready"}  # one of two is enough
    s2 = settings([dead], health={"active": True, "interval_s": 0.1, "timeout_s": 0.5})
    gw2 = start_gateway(serve_asgi, s2)
    assert wait_for(lambda: httpx.get(gw2 + "/readyz").status_code == 503, 3.0)
    assert httpx.get(gw2 + "/healthz").status_code == 200


def test_concurrent_streams(serve_asgi: Any, sim: Sim, clients: Clients) -> None:
    gw = start_gateway(serve_asgi, settings([sim.url]))
    client = clients(gw)
    errors: list[BaseException] = []

    def one() -> None:
        try:
            n = sum(1 for _ in client.chat.completions.create(
                model="llama-3.1-8b", messages=MESSAGES, stream=True))
            assert n == 17
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sim.stats()["completed"] == 16


def test_connect_timeout_is_retried_then_504(serve_asgi: Any, sim: Sim, clients: Clients) -> None:
    """A replica whose accept queue is full never completes the TCP handshake."""
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(0)
    port = blocker.getsockname()[1]
    fillers = []
    for _ in range(4):  # fill the accept queue; later SYNs are dropped
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    # The first connection completes its handshake into the (now full) accept queue.
    select.select([], fillers[:1], [], 5.0)
    try:
        hung = f"http://127.0.0.1:{port}"
        gw = start_gateway(serve_asgi, settings([hung], timeouts={"connect_s": 0.3}))
        r = httpx.post(gw + "/v1/chat/completions", json=CHAT, headers=AUTH_A)
        _shape(r, 504, "upstream_connect_timeout")
        recorder = Recorder()
        gw2 = start_gateway(serve_asgi, settings([hung, sim.url], timeouts={"connect_s": 0.3}),
                            observers=[recorder])
        for _ in range(2):
            clients(gw2).chat.completions.create(model="llama-3.1-8b", messages=MESSAGES)
        assert sim.stats()["received"] == 2
        assert sorted(r.attempts for r in recorder.wait(2)) == [1, 2]
    finally:
        for s in fillers:
            s.close()
        blocker.close()
