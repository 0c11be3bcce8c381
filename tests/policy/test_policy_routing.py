"""The gateway's route policy (``gateway.egress.PolicyRoutes``, the production class) over the
policy package's :meth:`~policy.Policy.select`: which replicas a request may reach, and why."""

from __future__ import annotations

import pytest

from gateway.auth import Principal as GatewayPrincipal
from gateway.egress import PolicyRoutes
from gateway.errors import ClassChangeRefused, InvalidRequest
from gateway.fleet.model_settings import ModelSettings
from gateway.routing import Replica
from policy import Policy

MODEL = ModelSettings(name="m", replicas=[{"url": "http://10.20.0.12:8000"}])


def _replicas() -> list[Replica]:
    return [
        Replica(model="m", index=0, url="http://10.20.0.12:8000", destination="vllm-eu-b"),
        Replica(model="m", index=1, url="http://10.20.0.11:8000", destination="vllm-eu-a"),
        Replica(model="m", index=2, url="http://10.20.0.13:8000", destination=None),
    ]


def _caller(data_class: str, team: str | None = "engineering",
            key_id: str = "k") -> GatewayPrincipal:
    return GatewayPrincipal(key_id=key_id, team=team, data_class=data_class,
                            models=frozenset({"*"}))


def test_confidential_routes_only_to_eu_no_retention(policy: Policy) -> None:
    route = PolicyRoutes(policy)
    replicas = _replicas()
    decision = route.decide(_caller("confidential"), MODEL, replicas)
    assert decision.candidates == (replicas[1],)
    assert decision.rule_id == "sensitive-eu-no-retention"
    assert decision.revision == policy.revision and decision.reason is None
    internal = route.decide(_caller("internal"), MODEL, replicas)
    assert internal.candidates == (replicas[0], replicas[1])
    assert internal.rule_id == "internal-eu"


def test_nothing_allowed_names_the_rule_and_the_reason(policy: Policy) -> None:
    decision = PolicyRoutes(policy).decide(_caller("public", team="contractors"), MODEL,
                                           _replicas())
    assert decision.candidates == () and decision.rule_id == "block-contractor"
    assert decision.reason == "denied by rule block-contractor"


def test_undefined_class_is_a_client_error(policy: Policy) -> None:
    with pytest.raises(InvalidRequest) as info:
        PolicyRoutes(policy).decide(_caller("secret"), MODEL, _replicas())
    assert info.value.code == "unknown_data_class"


def test_classification_header_changes_the_class_only_by_grant(policy: Policy) -> None:
    route = PolicyRoutes(policy)
    lowered = route.classify(_caller("confidential", team="research"), "internal")
    assert lowered.data_class == "internal"
    with pytest.raises(ClassChangeRefused):
        route.classify(_caller("confidential"), "internal")
    assert route.classify(_caller("confidential"), None).data_class == "confidential"
