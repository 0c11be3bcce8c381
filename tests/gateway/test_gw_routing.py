"""Replica selection and passive health (pure logic, fake clock)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gateway.assembly import Gateway
from gateway.auth import Principal, principal_of
from gateway.fleet.model_settings import ModelSettings, ReplicaSettings
from gateway.routing import Pool, Replica, RouteDecision, Router, RouteTable
from tests.gateway.helpers import settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pool(n: int, strategy: str = "least_outstanding", clock: Clock | None = None) -> Pool:
    model = ModelSettings(
        name="m",
        strategy=strategy,  # type: ignore[arg-type]
        replicas=[ReplicaSettings(url=f"http://10.0.0.{i}:8000") for i in range(n)],
    )
    return Pool(model, cooldown_s=10.0, clock=clock or Clock())


def test_least_outstanding_prefers_idle_replica() -> None:
    p = pool(3)
    p.replicas[0].outstanding = 2
    p.replicas[1].outstanding = 1
    p.replicas[2].outstanding = 5
    assert p.pick() is p.replicas[1]


def test_ties_are_spread_round_robin() -> None:
    p = pool(3)
    picks = [p.pick() for _ in range(6)]
    assert {r.index for r in picks if r is not None} == {0, 1, 2}


def test_pools_of_several_pods_do_not_start_their_turns_in_lockstep() -> None:
    """Each pod builds its own pool: behind a round-robin front, pods whose turns all start at
    the same replica send consecutive requests to one replica. Twenty pools of three replicas
    all starting alike would happen by chance with probability 3**-19."""
    starts = {pool(3, "round_robin").pick().index for _ in range(20)}  # type: ignore[union-attr]
    assert len(starts) > 1


def test_round_robin_cycles_regardless_of_load() -> None:
    p = pool(3, "round_robin")
    p.replicas[1].outstanding = 100
    seq = [p.pick().index for _ in range(6)]  # type: ignore[union-attr]
    assert sorted(seq[:3]) == [0, 1, 2] and seq[:3] == seq[3:]


def test_ejection_and_cooldown() -> None:
    clock = Clock()
    p = pool(2, clock=clock)
    p.eject(p.replicas[0])
    assert all(p.pick() is p.replicas[1] for _ in range(4))
    clock.now += 10.0
    assert {p.pick().index for _ in range(4)} == {0, 1}  # type: ignore[union-attr]


def test_exclude_and_exhaustion() -> None:
    p = pool(2)
    assert p.pick(exclude=[p.replicas[0]]) is p.replicas[1]
    assert p.pick(exclude=p.replicas) is None


def test_panic_routing_when_all_ejected() -> None:
    clock = Clock()
    p = pool(2, clock=clock)
    p.eject(p.replicas[0], 30)
    p.eject(p.replicas[1], 5)
    assert not p.ready()
    assert p.pick() is p.replicas[1]  # soonest back first


def test_active_probe_failure_and_recovery() -> None:
    p = pool(2)
    p.replicas[0].mark_probe(False)
    assert p.pick() is p.replicas[1] and p.ready()
    p.replicas[1].mark_probe(False)
    assert not p.ready()
    p.eject(p.replicas[0])
    p.replicas[0].mark_probe(True)  # a passing probe ends the ejection
    assert p.ready() and p.pick() is p.replicas[0]


def test_candidates_filter_from_policy() -> None:
    p = pool(3)
    assert p.pick(candidates=(p.replicas[2],)) is p.replicas[2]


def test_router_resolves_names_and_aliases() -> None:
    r = Router(settings(["http://127.0.0.1:1"]))
    assert r.resolve("default") is r.resolve("llama-3.1-8b") is r.pools["llama-3.1-8b"]
    assert r.resolve("nope") is None
    assert r.not_ready() == []


class CountingPolicy:
    """A routing policy that allows the first replica and counts its decisions."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def decide(
        self, principal: Principal, model: ModelSettings, replicas: Sequence[Replica]
    ) -> RouteDecision:
        self.calls.append((principal.key_id, principal.data_class, model.name))
        return RouteDecision(tuple(replicas[:1]), "first")


def test_the_route_table_decides_once_per_model_and_principal() -> None:
    s = settings(["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    router = Router(s)
    policy = CountingPolicy()
    table = RouteTable(policy)
    principals = [principal_of(k) for k in s.keys]
    table.prefill(router, principals)
    pairs = [(p, pool) for p in principals for name, pool in router.pools.items()
             if p.may_use(name)]
    assert pairs and len(policy.calls) == len(pairs) == len(table)
    decided = [table.decide(p, pool) for p, pool in pairs]  # the route step: lookups only
    assert len(policy.calls) == len(pairs)
    assert all(d.rule_id == "first" and len(d.candidates) == 1 for d in decided)
    # A class changed by the classification header: decided on first use, then kept.
    p, pool = pairs[0]
    other = dataclasses.replace(p, data_class="confidential")
    assert table.decide(other, pool) is table.decide(other, pool)
    assert policy.calls[-1] == (p.key_id, "confidential", pool.model.name)
    assert len(policy.calls) == len(pairs) + 1


def test_a_policy_that_is_not_pure_is_asked_on_every_request() -> None:
    s = settings(["http://10.0.0.1:8000"])
    router = Router(s)
    policy = CountingPolicy()
    table = RouteTable(policy, memo=False)
    principal = principal_of(s.keys[0])
    table.prefill(router, [principal])
    assert policy.calls == []
    pool = next(iter(router.pools.values()))
    table.decide(principal, pool)
    table.decide(principal, pool)
    assert len(policy.calls) == 2 and len(table) == 0
    # A routing policy handed to the app by hand is treated as not pure.
    assert not Gateway.of(s, route_policy=policy).routes.memo
    assert Gateway.of(s).routes.memo  # AllowAll
