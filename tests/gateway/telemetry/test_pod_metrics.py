"""The pod's ``/metrics`` (``gateway serve --workers N``): the merged expositions of the
workers equal what one process that saw every request would export."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.relay.records import RequestRecord
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.pod import merge_expositions
from gateway.telemetry.prometheus import PrometheusCollector


def _record(i: int) -> RequestRecord:
    r = RequestRecord(request_id=f"r{i}", started_at=0.0, method="POST",
                      path="/v1/chat/completions", key_id=("a", "b")[i % 2], model="m",
                      canonical_model="m", stream=True)
    r.status, r.outcome = (200, "ok") if i % 5 else (502, "upstream_error")
    r.latency_ms, r.ttft_ms = 3.0 * i + 1, 0.5 * i + 0.2
    r.input_tokens, r.output_tokens, r.attempts = 10 + i, 1 + 7 * i, 1 + i % 3
    return r


def _exposition(records: list[RequestRecord], queue: int = 0) -> str:
    metrics = GatewayMetrics(Resource({"service.name": "t"}))
    metrics.watch_audit_queue(lambda: queue)
    for r in records:
        metrics.record_request(r)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrometheusCollector(metrics.set))
    return generate_latest(registry).decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_merged_workers_equal_one_process_that_saw_every_request() -> None:
    records = [_record(i) for i in range(40)]
    worker0, worker1 = records[::3], [r for i, r in enumerate(records) if i % 3]
    merged = generate_latest(_Fams(merge_expositions(
        [_exposition(worker0, queue=2), _exposition(worker1, queue=5)]))).decode()
    whole = _exposition(records, queue=7)  # the audit queue depth gauge: the sum
    got, want = _samples(merged), _samples(whole)
    assert got.keys() == want.keys()
    assert got == {k: pytest.approx(v, rel=1e-12) for k, v in want.items()}  # float sums
    assert _samples(merged)[("sg_gateway_requests_total", (
        ("gen_ai_request_model", "m"), ("http_response_status_code", "200"),
        ("sg_key_id", "a"), ("sg_outcome", "ok")))] == 16


def test_replica_health_is_the_minimum_and_in_flight_the_sum() -> None:
    def text(healthy: int, inflight: int) -> str:
        labels = 'gen_ai_request_model="m",sg_destination_id="",sg_replica="http://r"'
        return (f"# TYPE sg_gateway_replica_healthy gauge\n"
                f"sg_gateway_replica_healthy{{{labels}}} {healthy}\n"
                f"# TYPE sg_gateway_replica_inflight gauge\n"
                f"sg_gateway_replica_inflight{{{labels}}} {inflight}\n")

    merged = {f.name: f.samples[0].value for f in merge_expositions([text(1, 3), text(0, 4)])}
    assert merged == {"sg_gateway_replica_healthy": 0, "sg_gateway_replica_inflight": 7}


class _Fams:
    def __init__(self, fams: list[Any]) -> None:
        self.fams = fams

    def collect(self) -> list[Any]:
        return self.fams
