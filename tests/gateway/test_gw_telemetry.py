"""Telemetry in process: spans with an in-memory exporter, ``/metrics`` on the admin
port parsed with ``prometheus_client``'s parser, trace context propagated to the simulator.

The gateway is real (uvicorn on loopback), the client is the official openai SDK, the backends
are vLLM simulators (real uvicorn).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.audit import Signer, generate_key_file, write_key_pair
from gateway.telemetry import Telemetry, TelemetrySettings
from tests.conftest import free_port, wait_until
from tests.gateway.helpers import KEY_A, SERVED, Sim, settings, start_sim

PROMPT = "the secret prompt words"


class Stack:
    def __init__(self, url: str, telemetry: Telemetry, exporter: InMemorySpanExporter,
                 sims: list[Sim]) -> None:
        self.url = url
        self.telemetry = telemetry
        self.exporter = exporter
        self.sims = sims

    def client(self, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=KEY_A, max_retries=0,
                             timeout=20, default_headers=headers or None)

    def spans(self, n: int) -> list[ReadableSpan]:
        # on_end (which ends the server span) runs after the last byte reached the client
        deadline = time.monotonic() + 5
        while len(self.exporter.get_finished_spans()) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # and nothing more arrives
        spans = list(self.exporter.get_finished_spans())
        assert len(spans) == n, [s.name for s in spans]
        self.exporter.clear()
        return spans

    def metrics(self) -> dict[str, list[Any]]:
        text = httpx.get(f"http://127.0.0.1:{self.telemetry.admin.port}/metrics",
                         timeout=5).text
        out: dict[str, list[Any]] = {}
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                out.setdefault(sample.name, []).append(sample)
        return out


def _stack(serve_asgi: Callable[..., Any], urls: list[str] | None = None,
           sims: list[Sim] | None = None) -> Stack:
    sims = sims or [start_sim(serve_asgi)]
    exporter = InMemorySpanExporter()
    tel = Telemetry(TelemetrySettings(admin={"port": 0}), span_exporter=exporter)
    s = settings(urls or [s.url for s in sims], retries={"max_attempts": 3})
    app = create_app(s, assemble(s, telemetry=tel))
    return Stack(serve_asgi(app).url, tel, exporter, sims)


def _by_kind(spans: list[ReadableSpan]) -> tuple[ReadableSpan, list[ReadableSpan]]:
    server = [s for s in spans if s.kind == SpanKind.SERVER]
    clients = sorted((s for s in spans if s.kind == SpanKind.CLIENT),
                     key=lambda s: s.start_time or 0)
    assert len(server) == 1
    return server[0], clients


def _no_content(spans: list[ReadableSpan], *texts: str) -> None:
    for span in spans:
        for value in (span.attributes or {}).values():
            for text in texts:
                assert text not in str(value)


def test_non_streamed_request_spans(serve_asgi: Callable[..., Any]) -> None:
    st = _stack(serve_asgi)
    resp = st.client().chat.completions.create(
        model="default", messages=[{"role": "user", "content": PROMPT}], max_tokens=5,
        temperature=0.5)
    server, clients = _by_kind(st.spans(2))
    assert len(clients) == 1
    client = clients[0]
    assert server.name == "chat default"
    assert client.parent is not None and client.parent.span_id == server.context.span_id
    assert client.context.trace_id == server.context.trace_id
    a = server.attributes or {}
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "default"
    assert a["gen_ai.response.model"] == SERVED
    assert a["gen_ai.request.max_tokens"] == 5
    assert a["gen_ai.request.temperature"] == 0.5
    assert resp.usage is not None
    assert a["gen_ai.usage.input_tokens"] == resp.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == resp.usage.completion_tokens
    assert a["sg.key.id"] == "team-a"
    assert a["http.response.status_code"] == 200
    assert server.status.status_code == StatusCode.UNSET
    c = client.attributes or {}
    sim_port = int(st.sims[0].url.rsplit(":", 1)[1])
    assert (c["server.address"], c["server.port"]) == ("127.0.0.1", sim_port)
    assert c["gen_ai.request.model"] == SERVED
    assert c["http.response.status_code"] == 200
    assert c["gen_ai.usage.output_tokens"] == resp.usage.completion_tokens
    _no_content([server, client], PROMPT, resp.choices[0].message.content or PROMPT)


def test_streamed_request_continues_client_trace_and_propagates_it(
    serve_asgi: Callable[..., Any]
) -> None:
    st = _stack(serve_asgi)
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    tp = f"00-{trace_id}-{parent_id}-01"
    chunks = list(st.client(traceparent=tp).chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": PROMPT}], max_tokens=6,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None
    server, clients = _by_kind(st.spans(2))
    assert format(server.context.trace_id, "032x") == trace_id
    assert server.parent is not None and format(server.parent.span_id, "016x") == parent_id
    assert (server.attributes or {})["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert (server.attributes or {})["gen_ai.request.stream"] is True
    # the simulator saw our client span as its parent, in the same trace
    sent = st.sims[0].stats()["last_headers"]["traceparent"]
    _, sent_trace, sent_parent, flags = sent.split("-")
    assert sent_trace == trace_id
    assert sent_parent == format(clients[0].context.span_id, "016x")
    assert flags == "01"
    _no_content([server, *clients], PROMPT, text)


def test_retried_request_has_two_client_spans(serve_asgi: Callable[..., Any]) -> None:
    st = _stack(serve_asgi)
    # one 429 with Retry-After: 0: the gateway waits it out and tries again
    st.sims[0].fault(mode="status_429", retry_after_s=0, count=1)
    before = st.metrics()
    st.client().chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    server, clients = _by_kind(st.spans(3))
    assert len(clients) == 2
    first, second = clients
    assert (first.attributes or {})["http.response.status_code"] == 429
    assert first.status.status_code == StatusCode.ERROR
    assert (first.attributes or {})["error.type"] == "429"
    assert (second.attributes or {})["http.response.status_code"] == 200
    assert all(c.parent is not None and c.parent.span_id == server.context.span_id
               for c in clients)
    assert (server.attributes or {})["sg.upstream.attempts"] == 2
    after = st.metrics()
    assert _value(after, "sg_gateway_upstream_retries_total") - _value(
        before, "sg_gateway_upstream_retries_total") == 1


def test_upstream_failure_marks_spans_as_errors(serve_asgi: Callable[..., Any]) -> None:
    st = _stack(serve_asgi, urls=[f"http://127.0.0.1:{free_port()}"])
    with pytest.raises(openai.APIStatusError) as info:
        st.client().chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert info.value.status_code == 502
    server, clients = _by_kind(st.spans(2))
    assert server.status.status_code == StatusCode.ERROR
    assert (server.attributes or {})["error.type"] == "upstream_connect_error"
    assert (server.attributes or {})["http.response.status_code"] == 502
    assert clients[0].status.status_code == StatusCode.ERROR
    # error.type of a client span is the upstream client's exception class (the relay's own).
    assert (clients[0].attributes or {})["error.type"] == "ConnectFailed"


def test_refused_request_still_gets_a_server_span(serve_asgi: Callable[..., Any]) -> None:
    st = _stack(serve_asgi)
    r = httpx.post(st.url + "/v1/chat/completions", json={"model": "nope", "messages": []},
                   headers={"authorization": f"Bearer {KEY_A}"}, timeout=5)
    assert r.status_code == 404
    server, clients = _by_kind(st.spans(1))
    assert clients == []
    assert (server.attributes or {})["error.type"] == "model_not_found"


def _value(metrics: dict[str, list[Any]], name: str, **labels: str) -> float:
    total = 0.0
    for s in metrics.get(name, []):
        if all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


def test_metrics_move_by_the_right_amounts(serve_asgi: Callable[..., Any]) -> None:
    sim = start_sim(serve_asgi, ttft_s=0.05)
    st = _stack(serve_asgi, sims=[sim])
    before = st.metrics()
    client = st.client()
    usage_in = usage_out = 0
    for _ in range(3):
        resp = client.chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert resp.usage is not None
        usage_in += resp.usage.prompt_tokens
        usage_out += resp.usage.completion_tokens
    stream = client.chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
        stream=True, stream_options={"include_usage": True})
    last = list(stream)[-1]
    assert last.usage is not None
    usage_in += last.usage.prompt_tokens
    usage_out += last.usage.completion_tokens
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[], max_tokens=1)
    model = {"gen_ai_request_model": "llama-3.1-8b", "sg_key_id": "team-a"}
    # The client has the stream's last byte before the gateway records the request (on_end
    # runs after the response is sent): wait, bounded, until all five requests are recorded.
    deadline = time.monotonic() + 10
    while True:
        m = st.metrics()
        done = _value(m, "gen_ai_server_request_duration_seconds_count",
                      gen_ai_operation_name="chat")
        if done >= 5 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    ok = _value(m, "sg_gateway_requests_total", **model, sg_outcome="ok",
                http_response_status_code="200")
    assert ok - _value(before, "sg_gateway_requests_total", **model, sg_outcome="ok") == 4
    assert _value(m, "sg_gateway_requests_total", sg_outcome="invalid",
                  http_response_status_code="404") == 1
    inp, outp = {"gen_ai_token_type": "input"}, {"gen_ai_token_type": "output"}
    assert _value(m, "gen_ai_client_token_usage_sum", **inp) == usage_in
    assert _value(m, "gen_ai_client_token_usage_sum", **outp) == usage_out
    assert _value(m, "gen_ai_client_token_usage_count", **outp) == 4
    # TTFT reflects the simulator's 50 ms: nothing at or below 40 ms, every request counted
    ttft = "gen_ai_server_time_to_first_token_seconds"
    assert _value(m, ttft + "_count") == 4
    assert _value(m, ttft + "_bucket", le="0.04") == 0
    assert _value(m, ttft + "_sum") >= 4 * 0.05
    assert _value(m, "gen_ai_server_time_per_output_token_seconds_count") == 1
    assert _value(m, "gen_ai_server_request_duration_seconds_count",
                  gen_ai_operation_name="chat") == 5
    replica = {"sg_replica": sim.url, "gen_ai_request_model": "llama-3.1-8b"}
    assert _value(m, "sg_gateway_replica_healthy", **replica) == 1
    assert [s.value for s in m["sg_gateway_replica_inflight"]
            if s.labels["gen_ai_request_model"] == "llama-3.1-8b"] == [0]
    assert _value(m, "sg_egress_blocked_total") == 0


def test_metrics_are_not_on_the_client_port(serve_asgi: Callable[..., Any]) -> None:
    st = _stack(serve_asgi)
    assert httpx.get(st.url + "/metrics", timeout=5).status_code == 404
    assert httpx.get(f"http://127.0.0.1:{st.telemetry.admin.port}/metrics",
                     timeout=5).status_code == 200


def test_audit_append_latency_and_queue_depth(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    sim = start_sim(serve_asgi)
    key, _ = write_key_pair(Signer.generate(), tmp_path / "audit.key")
    s = settings([sim.url], audit={
        "store": f"sqlite://{tmp_path / 'audit.db'}", "signing_key_file": str(key),
        "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key")),
    })
    tel = Telemetry(TelemetrySettings(admin={"port": 0}), span_exporter=InMemorySpanExporter())
    st = Stack(serve_asgi(create_app(s, assemble(s, telemetry=tel))).url, tel,
               InMemorySpanExporter(), [sim])
    st.client().chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    m = st.metrics()
    appends = "sg_audit_append_duration_seconds_count"
    assert _value(m, appends, type="request.started") == 1
    assert _value(m, appends, type="request.completed") == 1
    assert _value(m, "sg_audit_append_duration_seconds_sum", type="request.started") > 0
    assert [x.value for x in m["sg_audit_queue_depth"]] == [0]


def test_dashboard_queries_only_exported_series(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    import json
    import re

    from gateway.telemetry import prometheus_name

    dash = json.loads((Path(__file__).parents[2] / "dashboards/sovereign-gateway.json")
                      .read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"\b(?:sg|gen_ai)_[a-z_]+", e)}
    used -= {"sg_key_id", "sg_layer", "sg_policy_rule_id", "sg_decision", "sg_replica",
             "sg_destination_id", "sg_outcome", "gen_ai_request_model", "gen_ai_token_type"}
    st = _stack(serve_asgi)
    list(st.client().chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        stream=True))
    # series that appear with their first event (a denial, a retry, an audit append)
    later = {prometheus_name("sg.gateway.policy.denials") + "_total",
             prometheus_name("sg.gateway.upstream.retries") + "_total",
             prometheus_name("sg.audit.append.failures") + "_total",
             prometheus_name("sg.audit.append.duration", "s") + "_bucket",
             prometheus_name("sg.audit.queue.depth")}
    exported: set[str] = set()

    def all_there() -> bool:
        # A finished request's series are folded in just after its stream ends (a lane run
        # on a loaded machine scraped before that).
        exported.update(st.metrics())
        return used <= exported | later

    with contextlib.suppress(AssertionError):
        wait_until(all_there, 10, "the dashboard's series")
    assert used and used <= exported | later, used - exported - later


def test_helm_chart_ships_the_same_dashboard() -> None:
    root = Path(__file__).parents[2]
    chart_copy = root / "helm/sovereign-gateway/dashboards/sovereign-gateway.json"
    assert chart_copy.read_bytes() == (root / "dashboards/sovereign-gateway.json").read_bytes()
