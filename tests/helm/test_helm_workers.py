"""The chart runs one gateway worker per CPU of the limit (``gateway serve --workers``), and one
when quota state is kept in memory (where several workers would each admit the whole limit)."""

from __future__ import annotations

from typing import Any

import pytest
import sg_helm as h


def _args(sets: dict[str, str]) -> list[str]:
    objs = h.render(h.SCENARIOS["default"], sets=sets)
    deploy: dict[str, Any] = next(
        o for o in h.by_kind(objs, "Deployment")
        if o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
        == "gateway")
    (container,) = [c for c in deploy["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "gateway"]
    return list(container["args"])


def _workers(sets: dict[str, str]) -> int:
    args = _args(sets)
    return int(args[args.index("--workers") + 1])


@pytest.mark.parametrize(("cpu", "workers"), [("2", 2), ("4", 4), ("1500m", 1), ("500m", 1),
                                              ("2.5", 2), ("8000m", 8)])
def test_auto_workers_follow_the_cpu_limit(cpu: str, workers: int) -> None:
    assert _workers({"resources.limits.cpu": cpu}) == workers


def test_an_explicit_worker_count_wins() -> None:
    assert _workers({"gateway.workers": "3", "resources.limits.cpu": "8"}) == 3


def test_memory_quotas_keep_one_worker_and_redis_quotas_use_every_core() -> None:
    memory = {"gateway.extraConfig.quotas.defaults.key.requests_per_minute": "60",
              "resources.limits.cpu": "4"}
    assert _workers(memory) == 1
    assert _workers({**memory, "gateway.extraConfig.quotas.backend": "redis"}) == 4
    assert _workers({**memory, "gateway.extraConfig.quotas.enabled": "false"}) == 4


def test_several_workers_with_memory_quotas_are_refused() -> None:
    err = h.refuse(h.SCENARIOS["default"], sets={
        "gateway.extraConfig.quotas.backend": "memory", "gateway.workers": "2"})
    assert "gateway.workers=2 with extraConfig.quotas.backend memory" in err


def test_a_worker_count_outside_the_schema_is_refused() -> None:
    err = h.refuse(h.SCENARIOS["default"], sets={"gateway.workers": "0"})
    assert "workers" in err
