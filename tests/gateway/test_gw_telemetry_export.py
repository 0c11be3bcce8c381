"""OTLP export only to the egress-policy destination of the collector.

The collector is ``oteltest``'s OTLP/HTTP sink (``tests/gateway/telemetry/otlp_sink.py``), which
decodes the export requests with the OpenTelemetry protobufs. In process: spans and metrics
arrive and carry the GenAI attributes and the response's usage. In a real ``gateway serve`` with
the process guard enforcing: spans arrive, the access line carries the trace id, nothing is
blocked; without a collector configured nothing connects to it, even with
``OTEL_EXPORTER_OTLP_ENDPOINT`` set.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.audit import Signer, generate_key_file, write_key_pair
from gateway.config.loader import parse
from gateway.errors import ConfigError
from gateway.telemetry import Telemetry, TelemetrySettings
from policy import Policy
from tests.conftest import free_port
from tests.gateway.helpers import KEY_A, SERVED, audit_export, config, start_sim
from tests.gateway.telemetry.otlp_sink import OtlpSink, attributes

ROOT = Path(__file__).parents[2]


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    sink = OtlpSink().start()
    yield sink
    sink.stop()


def _span_names(sink: OtlpSink) -> list[str]:
    return [s.name for s in sink.spans()]


def _trace_ids(sink: OtlpSink) -> set[str]:
    return {s.trace_id.hex() for s in sink.spans()}


def _policy_text(sim_port: int, collector_port: int) -> str:
    return (
        "version: 1\ndata_classes: [internal]\ndestinations:\n"
        f"  - {{id: sim, host: 127.0.0.1, port: {sim_port}, region: r, jurisdiction: EU, "
        "operator: o}\n"
        f"  - {{id: collector, url: 'http://127.0.0.1:{collector_port}', region: r, "
        "jurisdiction: EU, operator: o, purpose: telemetry}\n"
        "rules:\n  - {id: all, classes: [internal]}\n"
    )


def _points(sink: OtlpSink, name: str) -> list[tuple[dict[str, Any], Any]]:
    """(attributes, data point) of the last export of metric ``name`` (they are cumulative)."""
    last = sink.metrics()[name][-1]
    data = getattr(last, last.WhichOneof("data"))
    return [(attributes(p.attributes), p) for p in data.data_points]


def test_otlp_export_reaches_the_collector_destination(
    sink: OtlpSink, serve_asgi: Callable[..., Any]
) -> None:
    # sink first: set up before the gateway's server, it is stopped after it, so the final
    # metric push at the gateway's shutdown is not refused and retried with back-off (6 s).
    sim = start_sim(serve_asgi)
    pol = Policy.from_text(_policy_text(int(sim.url.rsplit(":", 1)[1]), sink.port))
    ts = TelemetrySettings(otlp_endpoint=sink.url, otlp_endpoint_destination="collector",
                           export_interval_s=0.2, admin={"port": 0})
    tel = Telemetry(ts, policy=pol)
    gw_settings = parse(config([sim.url]), {"VLLM_KEY": "x"})
    url = serve_asgi(create_app(gw_settings, assemble(gw_settings, telemetry=tel))).url
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0, timeout=20)
    resp = client.chat.completions.create(model="llama-3.1-8b", max_tokens=3,
                                          messages=[{"role": "user", "content": "hi"}])
    assert resp.usage is not None
    sink.wait(lambda s: "gen_ai.client.token.usage" in s.metrics())
    assert tel.tracer_provider.force_flush(5000)
    sink.wait(lambda s: len(s.spans()) >= 2)

    # spans: the server span with the GenAI attributes, the client span its child
    server = next(s for s in sink.spans() if s.kind == Span.SPAN_KIND_SERVER)
    client_span = next(s for s in sink.spans() if s.kind == Span.SPAN_KIND_CLIENT)
    assert server.name == "chat llama-3.1-8b"
    a = attributes(server.attributes)
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "vllm"
    assert a["gen_ai.request.model"] == "llama-3.1-8b"
    assert a["gen_ai.response.model"] == SERVED
    assert a["gen_ai.request.max_tokens"] == 3
    assert a["gen_ai.usage.input_tokens"] == resp.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == resp.usage.completion_tokens
    assert a["http.response.status_code"] == 200
    assert client_span.parent_span_id == server.span_id
    assert client_span.trace_id == server.trace_id
    c = attributes(client_span.attributes)
    assert (c["server.address"], c["server.port"]) == ("127.0.0.1", int(sim.url.rsplit(":", 1)[1]))
    assert c["gen_ai.request.model"] == SERVED
    assert "hi" not in {str(v) for v in (*a.values(), *c.values())}  # no content

    # metrics: GenAI names and attributes, values matching the response's usage
    tokens = {p[0]["gen_ai.token.type"]: p for p in _points(sink, "gen_ai.client.token.usage")}
    out_attrs, out = tokens["output"]
    assert out_attrs["gen_ai.request.model"] == "llama-3.1-8b"
    assert out_attrs["gen_ai.operation.name"] == "chat"
    assert (out.count, out.sum) == (1, resp.usage.completion_tokens)
    assert tokens["input"][1].sum == resp.usage.prompt_tokens
    [(ttft_attrs, ttft)] = _points(sink, "gen_ai.server.time_to_first_token")
    assert ttft.count == 1 and ttft.sum > 0 and ttft_attrs["sg.key.id"] == "team-a"
    [(req_attrs, req)] = _points(sink, "sg.gateway.requests")
    assert req.as_int == 1 and req_attrs["sg.outcome"] == "ok"
    assert {frozenset(r) for r in sink.resources()} == {frozenset({"service.name"})}


def test_collector_outside_its_destination_is_refused() -> None:
    pol = Policy.from_text(_policy_text(9001, 4318))
    with pytest.raises(ConfigError) as info:
        Telemetry(TelemetrySettings(otlp_endpoint="http://127.0.0.1:4319",
                                    otlp_endpoint_destination="collector"), policy=pol)
    assert info.value.message.startswith("telemetry.otlp_endpoint_destination: replica "
                                         "http://127.0.0.1:4319: port 4319")
    with pytest.raises(ConfigError) as info:
        Telemetry(TelemetrySettings(otlp_endpoint="http://127.0.0.1:4318",
                                    otlp_endpoint_destination="collector"))
    assert "needs the egress policy" in info.value.message


def _serve(tmp_path: Path, cfg: dict[str, Any], env: dict[str, str],
           port: int) -> tuple[str, list[dict[str, Any]]]:
    """Run ``gateway serve`` with ``cfg``, make two requests, stop it; return stderr, audit."""
    cfg_file = tmp_path / "gateway.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg_file)]
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE) as proc:
        try:
            deadline = time.monotonic() + 90  # start-up imports take 15 s on a loaded machine
            while True:
                try:
                    httpx.get(url + "/healthz", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    assert proc.poll() is None and time.monotonic() < deadline
                    time.sleep(0.1)
            client = openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0,
                                   timeout=20)
            for _ in range(2):
                client.chat.completions.create(model="llama-3.1-8b", max_tokens=3,
                                               messages=[{"role": "user", "content": "hi"}])
            # Nothing to wait for: the end of each response is sent only after every
            # observer's on_end (audit record, span, metrics); spans flush at shutdown.
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
    assert proc.returncode in (0, -signal.SIGTERM), err.decode()[-2000:]
    return err.decode(), audit_export(cfg["audit"]["store"])


def _serve_config(tmp_path: Path, sim_url: str, pfile: Path, port: int) -> dict[str, Any]:
    cfg = config([sim_url], listen={"host": "127.0.0.1", "port": port})
    cfg["models"] = cfg["models"][:1]
    cfg["keys"] = cfg["keys"][:1]
    cfg["keys"][0]["data_class"] = "internal"
    cfg["models"][0]["replicas"][0]["destination"] = "sim"
    cfg["logging"] = {"access_log": True, "format": "json"}
    cfg["policy"] = {"file": str(pfile), "guard": "enforce"}
    key, _ = write_key_pair(Signer.generate(), tmp_path / "audit.key")
    cfg["audit"] = {
        "store": f"sqlite://{tmp_path / 'audit.db'}", "signing_key_file": str(key),
        "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key")),
    }
    return cfg


def test_guarded_serve_exports_only_to_the_collector(
    serve_asgi: Callable[..., Any], tmp_path: Path, sink: OtlpSink
) -> None:
    sim = start_sim(serve_asgi)
    pfile = tmp_path / "policy.yaml"
    pfile.write_text(_policy_text(int(sim.url.rsplit(":", 1)[1]), sink.port))
    port = free_port()
    env = {**os.environ, "VLLM_KEY": "x"}

    # 1. a collector configured: spans and metrics reach it, nothing is blocked
    run1 = tmp_path / "run1"
    run1.mkdir()
    cfg = _serve_config(run1, sim.url, pfile, port)
    cfg["telemetry"] = {"otlp_endpoint": sink.url, "otlp_endpoint_destination": "collector",
                        "admin": {"port": free_port()}, "export_interval_s": 60}
    stderr, records = _serve(run1, cfg, env, port)
    assert [r for r in records if r["type"] == "egress.denied"] == []
    assert _span_names(sink).count("chat llama-3.1-8b") == 2
    assert "sg.gateway.requests" in sink.metrics()  # flushed at shutdown
    access = [json.loads(line) for line in stderr.splitlines()
              if line.startswith("{") and '"type":"access"' in line]
    traced = {a["trace_id"] for a in access if a.get("path") == "/v1/chat/completions"}
    assert len(traced) == 2 and traced <= _trace_ids(sink)
    assert "sg-test-key" not in stderr and '"hi"' not in stderr  # no keys, no content

    # 2. no collector configured, OTEL_* variables pointing at it: nothing is sent
    sink.clear()
    run2 = tmp_path / "run2"
    run2.mkdir()
    cfg = _serve_config(run2, sim.url, pfile, port)
    cfg["telemetry"] = {"admin": {"port": free_port()}}
    env2 = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "otlp", "HTTP_PROXY": f"http://127.0.0.1:{free_port()}"}
    _, records = _serve(run2, cfg, env2, port)
    assert (sink.connections(), sink.requests()) == (0, 0)  # not even a connection
    assert [r for r in records if r["type"] == "egress.denied"] == []


def test_check_config_validates_the_collector_destination(tmp_path: Path) -> None:
    pfile = tmp_path / "policy.yaml"
    pfile.write_text(_policy_text(9001, 4318))
    cfg = _serve_config(tmp_path, "http://127.0.0.1:9001", pfile, 8080)
    del cfg["audit"]
    cfg["telemetry"] = {"otlp_endpoint": "http://127.0.0.1:4318",
                        "otlp_endpoint_destination": "collector"}
    cfg_file = tmp_path / "gateway.yaml"

    def check() -> subprocess.CompletedProcess[str]:
        cfg_file.write_text(yaml.safe_dump(cfg))
        return subprocess.run([sys.executable, "-m", "gateway.cli", "check-config",
                               "--config", str(cfg_file), "--json"], cwd=ROOT, capture_output=True,
                              text=True, check=False, env={**os.environ, "VLLM_KEY": "x"})

    ok = check()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["telemetry"] == {"otlp_endpoint": "http://127.0.0.1:4318",
                                                  "admin": "127.0.0.1:9090"}
    cfg["telemetry"]["otlp_endpoint"] = "http://collector.example:4318"
    bad = check()
    assert bad.returncode == 1
    [problem] = json.loads(bad.stdout)["problems"]
    assert problem["key"] == "telemetry.otlp_endpoint_destination"
    assert problem["problem"].startswith(
        "replica http://collector.example:4318: host is not destination collector")
    cfg["telemetry"] = {"sample_ratio": 2}
    [problem] = json.loads(check().stdout)["problems"]
    assert problem["key"] == "telemetry.sample_ratio"
