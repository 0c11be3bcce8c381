"""The routing adapter against the gateway's real seam types (a contract test: the policy
package itself never imports gateway)."""

from __future__ import annotations

import pytest

from gateway.auth import Principal as GatewayPrincipal
from gateway.routing import Replica, RouteDecision
from policy import EgressRoutePolicy, Policy, Selection, UnknownDataClass


def _replicas() -> list[Replica]:
    return [
        Replica(model="m", index=0, url="http://10.20.0.12:8000", destination="vllm-eu-b"),
        Replica(model="m", index=1, url="http://10.20.0.11:8000", destination="vllm-eu-a"),
        Replica(model="m", index=2, url="http://10.20.0.13:8000", destination=None),
    ]


def _caller(data_class: str, team: str | None = "engineering") -> GatewayPrincipal:
    return GatewayPrincipal(key_id="k", team=team, data_class=data_class,
                            models=frozenset({"*"}))


def test_confidential_routes_only_to_eu_no_retention(policy: Policy) -> None:
    seen: list[Selection] = []
    route = EgressRoutePolicy(policy, RouteDecision, on_selection=seen.append)
    replicas = _replicas()
    decision = route.decide(_caller("confidential"), object(), replicas)
    assert isinstance(decision, RouteDecision)
    assert decision.candidates == (replicas[1],)
    assert decision.rule_id == "sensitive-eu-no-retention"
    assert seen[0].decisions[0].revision == policy.revision
    internal = route.decide(_caller("internal"), object(), replicas)
    assert internal.candidates == (replicas[0], replicas[1])


def test_nothing_allowed_names_the_rule(policy: Policy) -> None:
    route = EgressRoutePolicy(policy, RouteDecision)
    decision = route.decide(_caller("public", team="contractors"), object(), _replicas())
    assert decision.candidates == () and decision.rule_id == "block-contractor"


def test_undefined_class_is_an_error(policy: Policy) -> None:
    with pytest.raises(UnknownDataClass):
        EgressRoutePolicy(policy, RouteDecision).decide(_caller("secret"), object(), _replicas())
