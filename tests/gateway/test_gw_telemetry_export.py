"""OTLP export only to the egress-policy destination of the collector.

A local OTLP/HTTP receiver (a real ASGI app on loopback, decoding the protobuf bodies) stands in
for the collector. In process: spans and metrics arrive. In a real ``gateway serve`` with the
process guard enforcing: spans arrive, the access line carries the trace id, nothing is blocked;
without a collector configured nothing is sent, even with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.audit import Signer, generate_key_file, write_key_pair
from gateway.errors import ConfigError
from gateway.settings import parse
from gateway.telemetry import Telemetry, TelemetrySettings
from policy import Policy
from tests.conftest import free_port
from tests.gateway.helpers import KEY_A, config, start_sim

ROOT = Path(__file__).parents[2]


class Receiver:
    """What the OTLP/HTTP receiver got: (path, body) pairs."""

    def __init__(self) -> None:
        self.got: list[tuple[str, bytes]] = []

    def app(self) -> Starlette:
        async def receive(request: Request) -> Response:
            self.got.append((request.url.path, await request.body()))
            return Response(b"", media_type="application/x-protobuf")

        return Starlette(routes=[Route("/v1/traces", receive, methods=["POST"]),
                                 Route("/v1/metrics", receive, methods=["POST"])])

    def span_names(self) -> list[str]:
        names = []
        for path, body in self.got:
            if path == "/v1/traces":
                req = ExportTraceServiceRequest.FromString(body)
                names += [s.name for rs in req.resource_spans for ss in rs.scope_spans
                          for s in ss.spans]
        return names

    def trace_ids(self) -> set[str]:
        out = set()
        for path, body in self.got:
            if path == "/v1/traces":
                req = ExportTraceServiceRequest.FromString(body)
                out |= {s.trace_id.hex() for rs in req.resource_spans for ss in rs.scope_spans
                        for s in ss.spans}
        return out

    def metric_names(self) -> set[str]:
        names = set()
        for path, body in self.got:
            if path == "/v1/metrics":
                req = ExportMetricsServiceRequest.FromString(body)
                names |= {m.name for rm in req.resource_metrics for sm in rm.scope_metrics
                          for m in sm.metrics}
        return names


def _policy_text(sim_port: int, collector_port: int) -> str:
    return (
        "version: 1\ndata_classes: [internal]\ndestinations:\n"
        f"  - {{id: sim, host: 127.0.0.1, port: {sim_port}, region: r, jurisdiction: EU, "
        "operator: o}\n"
        f"  - {{id: collector, url: 'http://127.0.0.1:{collector_port}', region: r, "
        "jurisdiction: EU, operator: o, purpose: telemetry}\n"
        "rules:\n  - {id: all, classes: [internal]}\n"
    )


def _wait(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_otlp_export_reaches_the_collector_destination(
    serve_asgi: Callable[..., Any]
) -> None:
    sim = start_sim(serve_asgi)
    rec = Receiver()
    collector = serve_asgi(rec.app())
    pol = Policy.from_text(_policy_text(int(sim.url.rsplit(":", 1)[1]), collector.port))
    ts = TelemetrySettings(otlp_endpoint=collector.url, otlp_endpoint_destination="collector",
                           export_interval_s=0.2, admin={"port": 0})
    tel = Telemetry(ts, policy=pol)
    gw_settings = parse(config([sim.url]), {"VLLM_KEY": "x"})
    url = serve_asgi(create_app(gw_settings, assemble(gw_settings, telemetry=tel))).url
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0, timeout=20)
    client.chat.completions.create(model="llama-3.1-8b", max_tokens=3,
                                   messages=[{"role": "user", "content": "hi"}])
    _wait(lambda: "sg.gateway.requests" in rec.metric_names())
    assert tel.tracer_provider.force_flush(5000)
    assert "chat llama-3.1-8b" in rec.span_names()
    assert {"sg.gateway.requests", "gen_ai.server.time_to_first_token",
            "gen_ai.client.token.usage"} <= rec.metric_names()


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
            deadline = time.monotonic() + 30
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
    res = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "audit", "export", "--store",
         cfg["audit"]["store"]], cwd=ROOT, capture_output=True, text=True, check=True)
    return err.decode(), [json.loads(x) for x in res.stdout.splitlines() if x.strip()]


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
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    sim = start_sim(serve_asgi)
    rec = Receiver()
    collector = serve_asgi(rec.app())
    pfile = tmp_path / "policy.yaml"
    pfile.write_text(_policy_text(int(sim.url.rsplit(":", 1)[1]), collector.port))
    port = free_port()
    env = {**os.environ, "VLLM_KEY": "x"}

    # 1. a collector configured: spans and metrics reach it, nothing is blocked
    run1 = tmp_path / "run1"
    run1.mkdir()
    cfg = _serve_config(run1, sim.url, pfile, port)
    cfg["telemetry"] = {"otlp_endpoint": collector.url, "otlp_endpoint_destination": "collector",
                        "admin": {"port": free_port()}, "export_interval_s": 60}
    stderr, records = _serve(run1, cfg, env, port)
    assert [r for r in records if r["type"] == "egress.denied"] == []
    assert rec.span_names().count("chat llama-3.1-8b") == 2
    assert "sg.gateway.requests" in rec.metric_names()  # flushed at shutdown
    access = [json.loads(line) for line in stderr.splitlines()
              if line.startswith("{") and '"type":"access"' in line]
    traced = {a["trace_id"] for a in access if a.get("path") == "/v1/chat/completions"}
    assert len(traced) == 2 and traced <= rec.trace_ids()
    assert "sg-test-key" not in stderr and '"hi"' not in stderr  # no keys, no content

    # 2. no collector configured, OTEL_* variables pointing at it: nothing is sent
    rec.got.clear()
    run2 = tmp_path / "run2"
    run2.mkdir()
    cfg = _serve_config(run2, sim.url, pfile, port)
    cfg["telemetry"] = {"admin": {"port": free_port()}}
    env2 = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "otlp", "HTTP_PROXY": f"http://127.0.0.1:{free_port()}"}
    _, records = _serve(run2, cfg, env2, port)
    assert rec.got == []
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
                               str(cfg_file), "--json"], cwd=ROOT, capture_output=True,
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
