"""``bench/routing.py``'s references and options: ``partition``, ``--capacity``, ``--variant``.

Pure parts, no replicas started and nothing timed: the static partition's assignment, the
requests the capacity is measured with, the flags, and the ``routing:`` section a variant's
gateway gets (validated by the gateway's own settings parser).
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from typing import Any

import pytest

from gateway.config.loader import parse
from tests.bench.scripts import bench_module

routing = bench_module("routing")
load = bench_module("routing_load")

URLS = ["http://r0", "http://r1", "http://r2"]


def _bodies(turns: list[Any]) -> list[dict[str, Any]]:
    """The request bodies ``routing_load.run`` builds (first round of history only)."""
    out = []
    for turn in turns:
        body: dict[str, Any] = {"messages": turn.messages}
        if turn.user is not None:
            body["user"] = turn.user
        out.append(body)
    return out


def _assign(target: Any, bodies: list[dict[str, Any]]) -> list[str]:
    async def pick_all() -> list[str]:
        return [await target.pick(b) for b in bodies]

    return asyncio.run(pick_all())


def test_partition_deals_new_groups_in_turn_and_keeps_each_on_its_replica() -> None:
    spec = load.WorkloadSpec(groups=7, prompts_per_group=5, system_tokens=12,
                             question_tokens=3)
    turns = load.build("shared-prefix", spec, 10.0, seed=3)
    bodies = _bodies(turns)
    urls = _assign(routing._Partition(URLS), bodies)
    owner: dict[str, str] = {}
    first_seen: list[str] = []
    for body, url in zip(bodies, urls, strict=True):
        group = body["messages"][0]["content"]
        if group not in owner:
            first_seen.append(group)
            owner[group] = url
        assert owner[group] == url, "a group moved to another replica"
    # the k-th new group goes to replica k mod n: 7 groups over 3 replicas -> 3, 2, 2
    assert [owner[g] for g in first_seen] == [URLS[k % 3] for k in range(7)]
    assert sorted(Counter(owner.values()).values()) == [2, 2, 3]


def test_partition_keys_multi_turn_conversations_by_user_not_the_shared_prompt() -> None:
    spec = load.WorkloadSpec(users=6, rounds=3, user_system_tokens=10, turn_tokens=4)
    turns = load.build("multi-turn", spec, 10.0, seed=1)
    bodies = _bodies(turns)
    assert len({b["messages"][0]["content"] for b in bodies}) == 1  # one system prompt
    urls = _assign(routing._Partition(URLS), bodies)
    by_user: dict[str, set[str]] = {}
    for body, url in zip(bodies, urls, strict=True):
        by_user.setdefault(body["user"], set()).add(url)
    assert all(len(u) == 1 for u in by_user.values()), by_user
    assert Counter(next(iter(u)) for u in by_user.values()) == dict.fromkeys(URLS, 2)


def test_capacity_cold_is_unshared_prompts_of_the_workloads_length() -> None:
    spec = load.WorkloadSpec(groups=4, prompts_per_group=3, system_tokens=20,
                             question_tokens=5)
    turns = routing._capacity_turns("shared-prefix", spec, "cold", 25, 8, seed=1)
    assert len(turns) == 16  # two rounds of the 8 streams
    prompts = [t.messages[0]["content"] for t in turns]
    assert all(len(t.messages) == 1 and len(p.split()) == 25 for t, p in zip(turns, prompts,
                                                                            strict=True))
    assert len({p.split()[0].rsplit("w", 1)[0] for p in prompts}) == 16  # no shared prefix


def test_capacity_workload_is_the_workloads_own_requests_on_another_schedule() -> None:
    spec = load.WorkloadSpec(groups=4, prompts_per_group=3, system_tokens=20,
                             question_tokens=5)
    own = load.build("shared-prefix", spec, 1.0, seed=1)
    turns = routing._capacity_turns("shared-prefix", spec, "workload", 25, 8, seed=1)

    def prompts(ts: list[Any]) -> list[tuple[str, ...]]:
        return [tuple(m["content"] for m in t.messages) for t in ts]

    # the same requests (cache hits included), in another order
    assert sorted(prompts(turns)) == sorted(prompts(own))
    assert prompts(turns) != prompts(own)
    # random shares nothing: measured as cold
    rnd = routing._capacity_turns("random", spec, "workload", 25, 8, seed=1)
    assert len(rnd) == 16 and all(len(t.messages[0]["content"].split()) == 25 for t in rnd)


def test_capacity_workload_multi_turn_has_a_user_per_stream_with_the_same_rounds() -> None:
    spec = load.WorkloadSpec(users=4, rounds=3, user_system_tokens=10, turn_tokens=4)
    turns = routing._capacity_turns("multi-turn", spec, "workload", 100, 16, seed=1)
    users = Counter(t.user for t in turns)
    assert len(users) == 16 and set(users.values()) == {3}
    more = routing._capacity_turns("multi-turn", spec, "workload", 100, 2, seed=1)
    assert len({t.user for t in more}) == 4  # never fewer users than the workload's


def test_flags_parse_capacity_partition_and_variants() -> None:
    args = routing.parse_args(["--capacity", "workload", "--strategy", "partition",
                               "--strategy", "prefix_affinity",
                               "--variant", 'p25={"weights": {"prefill": 0.25}}',
                               "--variant", 'sess={"session_affinity": true}'])
    assert args.capacity == "workload"
    assert args.strategy == ["partition", "prefix_affinity"]
    assert args.variant == [("p25", {"weights": {"prefill": 0.25}}),
                            ("sess", {"session_affinity": True})]
    assert routing.parse_args([]).capacity == "cold"


@pytest.mark.parametrize("argv", [
    ["--capacity", "measured"],
    ["--strategy", "static"],
    ["--variant", "p25"],
    ["--variant", '={"load": 1}'],
    ["--variant", "p25={weights: 1}"],
    ["--variant", "p25=[1, 2]"],
    ["--variant", 'a={"load": 1}', "--variant", 'a={"load": 2}'],
])
def test_malformed_flags_are_refused_before_anything_starts(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        routing.parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_parse_variant_names_what_is_wrong() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="p25: not JSON"):
        routing.parse_variant("p25={weights")
    with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=JSON"):
        routing.parse_variant('{"load": 1}')


def test_a_variant_updates_the_routing_section_and_merges_weights() -> None:
    base = {"chars_per_token": 7.5, "weights": {"prefix": 1.0, "load": 0.25}}
    merged = routing.variant_routing(base, {"weights": {"prefill": 0.25},
                                            "session_affinity": True})
    assert merged == {"chars_per_token": 7.5, "session_affinity": True,
                      "weights": {"prefix": 1.0, "load": 0.25, "prefill": 0.25}}
    assert base == {"chars_per_token": 7.5, "weights": {"prefix": 1.0, "load": 0.25}}
    assert routing.variant_routing({}, {"weights": {"kv": 0}}) == {"weights": {"kv": 0}}
    assert routing.variant_routing(base, {"chars_per_token": 4})["chars_per_token"] == 4


def test_a_variants_gateway_config_is_valid_and_carries_the_variant() -> None:
    base = {"chars_per_token": 7.5, "weights": {"load": 0.5}}
    _, update = routing.parse_variant('p25={"weights": {"prefill": 0.25}}')
    cfg = routing._gateway_config(URLS, 8123, ["prefix_affinity"],
                                  routing.variant_routing(base, update))
    settings = parse(cfg)
    assert [m.name for m in settings.models] == ["route-prefix_affinity"]
    assert settings.models[0].strategy == "prefix_affinity"
    weights = settings.routing.weights
    assert (weights.prefill, weights.load, weights.prefix) == (0.25, 0.5, 1.0)
    assert settings.routing.chars_per_token == 7.5
