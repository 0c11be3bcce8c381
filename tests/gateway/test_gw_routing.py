"""Replica selection and passive health (pure logic, fake clock)."""

from __future__ import annotations

from gateway.routing import Pool, Router
from gateway.settings import ModelSettings, ReplicaSettings
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
