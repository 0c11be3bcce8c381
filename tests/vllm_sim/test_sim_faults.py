"""Fault modes of the simulator and its bookkeeping of cancelled requests."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import openai
import pytest

from vllm_sim.tokens import OUTPUT_TOKENS

MSG = [{"role": "user", "content": "hi"}]
STREAM_BODY = json.dumps(
    {"model": "sim-model", "messages": MSG, "stream": True,
     "stream_options": {"include_usage": True}}
).encode()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_refused_connection_uses_a_closed_port() -> None:
    # An ASGI app cannot refuse connections: tests point clients at a port nobody listens on.
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{_closed_port()}/v1", api_key="x",
                           max_retries=0)
    with pytest.raises(openai.APIConnectionError):
        client.models.list()
    client.close()


def test_status_500_for_count_requests_then_healthy(sim: Any) -> None:
    applied = sim.fault(mode="status_500", count=2)
    assert applied["mode"] == "status_500" and applied["count"] == 2
    for _ in range(2):
        with pytest.raises(openai.InternalServerError) as exc:
            sim.client.chat.completions.create(model="sim-model", messages=MSG)
        assert exc.value.response.headers["x-simulator"] == "vllm-sim"
        assert set(exc.value.response.json()["error"]) == {"message", "type", "param", "code"}
    ok = sim.client.chat.completions.create(model="sim-model", messages=MSG)
    assert ok.choices[0].finish_reason == "stop"
    stats = sim.stats()
    assert (stats["faults_applied"], stats["errors"], stats["completed"]) == (2, 2, 1)
    assert stats["fault"]["mode"] == "none"


def test_status_429_with_retry_after(sim: Any) -> None:
    sim.fault(mode="status_429", retry_after_s=7)
    with pytest.raises(openai.RateLimitError) as exc:
        sim.client.completions.create(model="sim-model", prompt="x")
    assert exc.value.response.headers["retry-after"] == "7"
    assert exc.value.response.json()["error"]["code"] == 429
    # not an inference path: unaffected by default
    assert sim.client.models.list().data[0].id == "sim-model"


def test_fault_paths_can_target_health(sim: Any) -> None:
    sim.fault(mode="status_500", paths=["/health"], count=1)
    assert httpx.get(f"{sim.url}/health").status_code == 500
    assert httpx.get(f"{sim.url}/health").status_code == 200
    assert sim.client.chat.completions.create(model="sim-model", messages=MSG).choices


def test_invalid_fault_is_400_and_reset_clears(sim: Any) -> None:
    resp = httpx.post(f"{sim.url}/sim/faults", json={"mode": "explode"})
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "BadRequestError"
    sim.fault(mode="status_500")
    assert httpx.get(f"{sim.url}/sim/faults").json()["mode"] == "status_500"
    httpx.post(f"{sim.url}/sim/reset")
    assert httpx.get(f"{sim.url}/sim/faults").json()["mode"] == "none"
    assert sim.client.chat.completions.create(model="sim-model", messages=MSG).choices


@pytest.mark.parametrize("stream", [False, True])
def test_hang_sends_nothing_and_disconnect_counts_as_cancelled(sim: Any, stream: bool) -> None:
    sim.fault(mode="hang")
    body = {"model": "sim-model", "messages": MSG, "stream": stream}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=0.3)
    stats = sim.wait_stats(lambda s: s["cancelled"] == 1)
    assert (stats["running"], stats["cancelled"], stats["completed"]) == (0, 1, 0)


def test_disconnect_during_ttft_cancels(start_sim: Any) -> None:
    sim = start_sim(ttft_s=30.0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{sim.url}/v1/chat/completions",
                   json={"model": "sim-model", "messages": MSG}, timeout=0.3)
    stats = sim.wait_stats(lambda s: s["cancelled"] == 1)
    assert (stats["running"], stats["cancelled"], stats["received"]) == (0, 1, 1)


def test_disconnect_mid_stream_cancels(start_sim: Any) -> None:
    sim = start_sim(itl_s=0.05, tokens_per_response=200)
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions",
                      json={"model": "sim-model", "messages": MSG, "stream": True}) as resp:
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(6)]
    assert got[0].startswith("data: ")
    stats = sim.wait_stats(lambda s: s["cancelled"] == 1)
    assert (stats["running"], stats["cancelled"], stats["completed"]) == (0, 1, 0)
    page = httpx.get(f"{sim.url}/metrics").text  # vLLM 0.32 counts no success for an abort
    assert 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="sim-model"}' \
        ' 0.0' in page
    assert 'finished_reason="stop",model_name="sim-model"} 0.0' in page


def test_die_mid_stream_after_n_events(sim: Any, raw_post: Any) -> None:
    sim.fault(mode="die_mid_stream", after_events=3, count=1)
    raw = raw_post(sim.port, "/v1/chat/completions", STREAM_BODY)
    assert raw.status == 200
    assert not raw.complete  # no terminating zero-length chunk
    events = [e for e in raw.body.split(b"\n\n") if e]
    assert len(events) == 3 and b"[DONE]" not in raw.body
    assert sim.stats()["aborted"] == 1
    # the SDK reports the broken stream as an error instead of a silently short answer
    sim.fault(mode="die_mid_stream", after_events=3)
    stream = sim.client.chat.completions.create(model="sim-model", messages=MSG, stream=True)
    seen = 0
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for _ in stream:
            seen += 1
    assert seen == 3


def test_die_mid_stream_non_streamed_cuts_the_body(sim: Any) -> None:
    sim.fault(mode="die_mid_stream")
    with pytest.raises(openai.APIConnectionError):
        sim.client.chat.completions.create(model="sim-model", messages=MSG)
    stats = sim.wait_stats(lambda s: s["aborted"] == 1)
    assert stats["running"] == 0 and stats["completed"] == 0


def test_die_after_more_events_than_the_stream_has(sim: Any, raw_post: Any) -> None:
    sim.fault(mode="die_mid_stream", after_events=1000)
    raw = raw_post(sim.port, "/v1/chat/completions", STREAM_BODY)
    assert not raw.complete and raw.body.endswith(b"data: [DONE]\n\n")


def test_split_writes_cut_inside_data_json_and_utf8(sim: Any, raw_post: Any) -> None:
    normal = raw_post(sim.port, "/v1/chat/completions", STREAM_BODY)
    sim.fault(mode="split_writes", split_delay_s=0.0)
    split = raw_post(sim.port, "/v1/chat/completions", STREAM_BODY)
    assert split.complete
    assert len(split.chunks) > 3 * len(normal.chunks) - 6
    assert any(c.startswith(b"dat") and not c.startswith(b"data:") for c in split.chunks)
    broken_utf8 = 0
    for chunk in split.chunks:
        try:
            chunk.decode("utf-8")
        except UnicodeDecodeError:
            broken_utf8 += 1
    # each event with a multi-byte token is cut between a lead byte and its continuation
    assert broken_utf8 == 2 * sum(1 for t in OUTPUT_TOKENS if not t.isascii())
    # same events apart from ids and timestamps
    def contents(raw: Any) -> str:
        docs = [json.loads(e[6:]) for e in raw.body.decode().split("\n\n")
                if e.startswith("data: {")]
        return "".join(d["choices"][0]["delta"].get("content", "") for d in docs if d["choices"])
    assert contents(split) == contents(normal) == "".join(OUTPUT_TOKENS)


def test_split_writes_still_parse_with_sdk(sim: Any) -> None:
    sim.fault(mode="split_writes")
    stream = sim.client.chat.completions.create(model="sim-model", messages=MSG, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "".join(OUTPUT_TOKENS)


def test_crlf_framing(sim: Any, raw_post: Any) -> None:
    sim.fault(mode="crlf")
    raw = raw_post(sim.port, "/v1/chat/completions", STREAM_BODY)
    assert raw.body.endswith(b"data: [DONE]\r\n\r\n")
    assert b"\n\n" not in raw.body.replace(b"\r\n\r\n", b"")
    stream = sim.client.chat.completions.create(model="sim-model", messages=MSG, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "".join(OUTPUT_TOKENS)


def test_running_counts_concurrent_requests(start_sim: Any) -> None:
    sim = start_sim(ttft_s=30.0)
    body = b'{"prompt": "x", "stream": true}'
    req = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    socks = [socket.create_connection(("127.0.0.1", sim.port)) for _ in range(3)]
    try:
        for sock in socks:
            sock.sendall(req)
        stats = sim.wait_stats(lambda s: s["running"] == 3)
        assert (stats["running"], stats["received"]) == (3, 3)
        page = httpx.get(f"{sim.url}/metrics").text
        assert 'vllm:num_requests_running{engine="0",model_name="sim-model"} 3.0' in page
    finally:
        for sock in socks:
            sock.close()
    stats = sim.wait_stats(lambda s: s["cancelled"] == 3)
    assert (stats["running"], stats["cancelled"], stats["completed"]) == (0, 3, 0)
