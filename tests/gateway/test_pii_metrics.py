"""Prometheus metrics of the sensitive-data stage: findings per entity type and action."""

from __future__ import annotations

import re

import pytest
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest

from gateway.config.loader import parse
from gateway.relay.records import RequestRecord
from gateway.routing import Router
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import PrometheusCollector
from policy import PiiRefused, Policy

POLICY = """\
version: 1
data_classes: [public, internal, personal]
pii:
  default_class: personal
  rules:
    - {id: no-cards, entities: [CREDIT_CARD], action: refuse}
"""


def _record(policy: Policy, text: str) -> RequestRecord:
    assert policy.pii is not None
    rec = RequestRecord(request_id="r", started_at=0.0, method="POST",
                        path="/v1/chat/completions", canonical_model="m", status=200,
                        outcome="ok")
    try:
        verdict = policy.pii.inspect(text, "k", None, "public")
    except PiiRefused as exc:
        verdict = exc.verdict  # type: ignore[assignment]
        rec.failed("denied", exc.code)
        rec.status = 403
    rec.detected(verdict.as_record())  # type: ignore[union-attr]
    return rec


def test_findings_are_counted_per_entity_type_and_action_never_with_values() -> None:
    policy = Policy.from_text(POLICY)
    settings = parse({"models": [{"name": "m", "replicas": [{"url": "http://10.0.0.1:8000"}]}],
                      "keys": []})
    metrics = GatewayMetrics(Resource.create({"service.name": "t"}), Router(settings))
    for text in ("IBAN DE89370400440532013000 and DE89 3704 0044 0532 0130 00",
                 "card 4111111111111111", "nothing here"):
        metrics.record_request(_record(policy, text))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrometheusCollector(metrics.set))
    page = generate_latest(registry).decode()

    def value(name: str, **labels: str) -> float:
        for line in page.splitlines():
            if line.startswith(name + "{") and all(
                    f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        pytest.fail(f"no {name} {labels} in:\n{page}")

    assert value("sg_gateway_pii_findings_total", sg_pii_entity="IBAN_CODE",
                 sg_pii_action="raise") == 2.0
    assert value("sg_gateway_pii_findings_total", sg_pii_entity="CREDIT_CARD",
                 sg_pii_action="refuse") == 1.0
    assert value("sg_gateway_pii_requests_total", sg_pii_class_before="public",
                 sg_pii_class_after="personal", sg_pii_outcome="found") == 1.0
    assert value("sg_gateway_pii_requests_total", sg_pii_outcome="refused") == 1.0
    assert value("sg_gateway_pii_requests_total", sg_pii_outcome="clean") == 1.0
    assert value("sg_gateway_policy_denials_total", layer="pii") == 1.0
    assert not re.search(r"DE89|4111", page)
