"""Flow control's pure logic: class queues (strict priority, deficit round robin), room, config."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from pydantic import ValidationError

from gateway.auth import Principal
from gateway.config.errors import InvalidConfig
from gateway.config.loader import parse
from gateway.fleet.replica_metrics import ReplicaSignals
from gateway.flow import ClassQueue, ClassQueues, SaturationSettings, Waiter, has_room, with_room
from gateway.flow.gate import FlowGate, Lane
from gateway.flow.settings import FlowControlSettings
from gateway.relay.records import RequestRecord
from gateway.relay.rewrite import parse_body
from gateway.routing import Router
from tests.gateway.helpers import config, sha


def _w(flow: str, n: int, weight: float = 1.0, cls: int = 0) -> Waiter[str]:
    return Waiter(flow, weight, cls, 0.0, f"{flow}{n}")


def _drain(q: ClassQueue[str]) -> list[str]:
    out = []
    while len(q):
        out.append(q.pop().item)
    return out


def test_equal_weights_alternate_between_keys_whatever_the_arrival_order() -> None:
    q: ClassQueue[str] = ClassQueue(100)
    for i in range(6):
        assert q.push(_w("heavy", i))
    for i in range(3):
        assert q.push(_w("light", i))
    assert _drain(q) == ["heavy0", "light0", "heavy1", "light1", "heavy2", "light2",
                         "heavy3", "heavy4", "heavy5"]


def test_weights_give_proportional_shares() -> None:
    q: ClassQueue[str] = ClassQueue(100)
    for i in range(3):
        q.push(_w("a", i, weight=1))
    for i in range(6):
        q.push(_w("b", i, weight=2))
    assert [x[0] for x in _drain(q)] == list("abbabbabb")


def test_fractional_weights_accumulate_credit() -> None:
    q: ClassQueue[str] = ClassQueue(100)
    for i in range(4):
        q.push(_w("slow", i, weight=0.5))
        q.push(_w("fast", i, weight=1.0))
    order = [x.rstrip("0123456789") for x in _drain(q)]
    # "slow" needs two rounds for a unit of credit: one of its requests per two of "fast".
    assert order[:6] == ["fast", "slow", "fast", "fast", "slow", "fast"]


def test_with_token_costs_a_key_sending_long_requests_gets_proportionally_fewer() -> None:
    """Equal weights, costs 400 and 100 (estimated tokens): the short key is served four
    requests per long one, the same tokens each, while both have requests waiting."""
    q: ClassQueue[str] = ClassQueue(100)
    for i in range(4):
        q.push(Waiter("long", 1.0, 0, 0.0, f"long{i}", cost=400))
    for i in range(16):
        q.push(Waiter("short", 1.0, 0, 0.0, f"short{i}", cost=100))
    order = [x.rstrip("0123456789") for x in _drain(q)]
    assert order.count("long") == 4 and order.count("short") == 16
    for end in range(5, 21, 5):  # every prefix: 1 long per 4 short, within one request
        head = order[:end]
        assert abs(4 * head.count("long") - head.count("short")) <= 4, head


def _reference_drr(flows: dict[str, tuple[float, list[float]]]) -> list[str]:
    """Deficit round robin as Shreedhar and Varghese describe it, one round at a time (no
    skipping): ``flows`` maps a flow to (quantum, costs of its requests in order)."""
    order: list[str] = []
    active = [name for name in flows]
    deficit = dict.fromkeys(flows, 0.0)
    queued = {name: list(costs) for name, (_, costs) in flows.items()}
    while active:
        for name in list(active):
            deficit[name] += flows[name][0]
            while queued[name] and deficit[name] >= queued[name][0]:
                deficit[name] -= queued[name].pop(0)
                order.append(name)
            if not queued[name]:
                active.remove(name)
                deficit[name] = 0.0
    return order


@pytest.mark.parametrize("seed", range(20))
def test_skipping_empty_rounds_serves_in_the_order_of_plain_drr(seed: int) -> None:
    import random

    rng = random.Random(seed)  # noqa: S311 - reproducible cases, not a secret
    flows = {f"f{i}": (rng.choice([0.5, 1.0, 2.0, 3.0]),
                       [float(rng.randint(1, 3000)) for _ in range(rng.randint(1, 8))])
             for i in range(rng.randint(1, 5))}
    q: ClassQueue[str] = ClassQueue(1000)
    for name, (weight, costs) in flows.items():
        for j, cost in enumerate(costs):
            q.push(Waiter(name, weight, 0, 0.0, f"{name}.{j}", cost=cost))
    assert [x.split(".")[0] for x in _drain(q)] == _reference_drr(flows)


def test_a_heavy_key_cannot_starve_a_light_one_that_arrives_late() -> None:
    q: ClassQueue[str] = ClassQueue(1000)
    for i in range(500):
        q.push(_w("heavy", i))
    q.pop()
    q.push(_w("light", 0))
    served = [q.pop().item for _ in range(3)]
    assert "light0" in served


def test_the_queue_is_bounded_and_a_waiter_leaves_from_anywhere() -> None:
    q: ClassQueue[str] = ClassQueue(3)
    a0, a1, b0 = _w("a", 0), _w("a", 1), _w("b", 0)
    assert q.push(a0) and q.push(a1) and q.push(b0)
    assert not q.push(_w("c", 0))  # full: refused, nothing changed
    assert len(q) == 3 and q.flows() == {"a": 2, "b": 1}
    assert q.remove(b0) and not q.remove(b0)
    assert q.flows() == {"a": 2}
    assert q.pop() is a0
    assert q.remove(a1) and len(q) == 0 and q.flows() == {}
    with pytest.raises(IndexError):
        q.pop()
    assert q.push(_w("c", 1)) and q.pop().item == "c1"


def test_strict_priority_between_classes() -> None:
    qs: ClassQueues[str] = ClassQueues([10, 10, 10])
    qs.push(_w("k", 0, cls=2))
    qs.push(_w("k", 1, cls=1))
    assert qs.top() == 1
    assert qs.waiting_at_or_above(1) and not qs.waiting_at_or_above(0)
    qs.push(_w("k", 2, cls=0))
    assert qs.top() == 0 and qs.lengths() == [1, 1, 1]
    assert [qs.pop(qs.top() or 0).item for _ in range(3)] == ["k2", "k1", "k0"]
    assert qs.top() is None and len(qs) == 0


@dataclass
class _Replica:
    outstanding: int = 0
    scrape_outstanding: int = 0
    signals: ReplicaSignals | None = None
    flow_in_flight: list[int] = field(default_factory=list)
    prefill_tokens: float = 0.0
    peer_in_flight: list[int] = field(default_factory=list)


def test_room_by_prefill_tokens_in_flight_without_any_scrape() -> None:
    """Saturation in tokens: one long uncached prompt fills a replica that many short ones
    would not; with N workers each assumes the others sent as much as it did."""
    now = 100.0
    batch = SaturationSettings(prefill_tokens=4096)
    assert has_room(_Replica(1, prefill_tokens=4000.0), 1, batch, now, 2.0)
    assert not has_room(_Replica(1, prefill_tokens=4096.0), 1, batch, now, 2.0)
    assert not has_room(_Replica(1, prefill_tokens=2100.0), 1, batch, now, 2.0, workers=2)
    assert has_room(_Replica(9, prefill_tokens=1e9), 0, SaturationSettings(), now, 2.0)


def test_room_by_in_flight_waiting_estimate_and_kv_usage() -> None:
    limits = SaturationSettings(queue_depth=2, kv_usage=0.8, in_flight=5)
    now = 100.0
    assert has_room(_Replica(), 0, limits, now, 2.0)
    assert not has_room(_Replica(5, flow_in_flight=[5]), 0, limits, now, 2.0)
    fresh = ReplicaSignals(at=99.5, waiting=1, running=8, kv_usage=0.5)
    assert has_room(_Replica(2, 2, fresh), 0, limits, now, 2.0)
    # One request sent since the scrape is assumed to wait: 1 + 1 reaches the depth of 2.
    assert not has_room(_Replica(3, 2, fresh), 0, limits, now, 2.0)
    # Two requests ended since the scrape: the waiting one runs, there is room again.
    assert has_room(_Replica(1, 3, fresh), 0, limits, now, 2.0)
    full_kv = ReplicaSignals(at=99.5, waiting=0, running=8, kv_usage=0.85)
    assert not has_room(_Replica(0, 0, full_kv), 0, limits, now, 2.0)
    # A stale scrape is not used: only the in-flight threshold judges.
    stale = ReplicaSignals(at=90.0, waiting=50, running=8, kv_usage=1.0)
    assert has_room(_Replica(4, 0, stale, [4]), 0, limits, now, 2.0)
    replicas = [_Replica(5, flow_in_flight=[5]), _Replica(0)]
    assert with_room(replicas, 0, limits, now, 2.0) == [replicas[1]]
    both = [_Replica(), _Replica()]
    assert with_room(both, 0, limits, now, 2.0) is both


def test_in_flight_counts_the_class_and_the_classes_below_never_those_above() -> None:
    """interactive 8, batch 4 on one replica: batch holds at most 4 whatever interactive
    holds, and interactive may fill the slots batch leaves."""
    now = 100.0
    inter, batch = SaturationSettings(in_flight=8), SaturationSettings(in_flight=4)
    # 3 interactive and 3 batch requests in flight: batch has room for a 4th (the
    # interactive ones are not counted against it), interactive for 2 more.
    r = _Replica(6, 6, flow_in_flight=[3, 3])
    assert has_room(r, 1, batch, now, 2.0)
    assert has_room(r, 0, inter, now, 2.0)
    # Batch at its 4: full for batch; interactive counts batch too (4 + 3 of 8: room for one).
    r = _Replica(7, 7, flow_in_flight=[3, 4])
    assert not has_room(r, 1, batch, now, 2.0)
    assert has_room(r, 0, inter, now, 2.0)
    r = _Replica(8, 8, flow_in_flight=[4, 4])
    assert not has_room(r, 0, inter, now, 2.0)
    # Three classes: the middle one counts itself and the one below, not the one above.
    assert not has_room(_Replica(5, flow_in_flight=[0, 2, 3]), 1,
                        SaturationSettings(in_flight=5), now, 2.0)
    assert has_room(_Replica(9, flow_in_flight=[5, 2, 2]), 1,
                    SaturationSettings(in_flight=5), now, 2.0)


def test_with_n_workers_the_waiting_estimate_counts_each_change_n_times() -> None:
    """Each worker sees only its own requests since the scrape and assumes the others sent
    as many: two workers may each send half the room left (1 of 2), not all of it."""
    limits = SaturationSettings(queue_depth=3)
    fresh = ReplicaSignals(at=99.5, waiting=1, running=8, kv_usage=0.5)
    assert has_room(_Replica(1, 0, fresh), 0, limits, 100.0, 2.0, workers=1)
    assert not has_room(_Replica(1, 0, fresh), 0, limits, 100.0, 2.0, workers=2)
    assert has_room(_Replica(0, 0, fresh), 0, limits, 100.0, 2.0, workers=2)


def test_a_lower_class_gets_its_whole_in_flight_allowance_beside_a_higher_one() -> None:
    """interactive 3, batch 2 on one replica: batch is not charged for the interactive
    requests in flight, and never takes the slot an interactive request leaves."""
    import asyncio

    gate, router = _gate(
        classes=[{"name": "interactive"}, {"name": "batch", "saturation": {"in_flight": 2}}],
        default_class="batch", saturation={"in_flight": 3},
        keys={"i": {"class": "interactive"}})
    pool = router.pools["llama-3.1-8b"]
    replica = pool.replicas[0]

    async def never_disconnects() -> dict[str, object]:
        await asyncio.Event().wait()
        return {}

    def lane(key: str) -> Lane:
        body = parse_body(b'{"model": "llama-3.1-8b"}')
        out = gate.lane(Principal(key, None, "internal", frozenset({"*"})), pool, [], body,
                        RequestRecord("r", 0.0, "POST", "/v1/chat/completions"))
        assert out is not None
        return out

    def forwarded(one: Lane) -> Lane:  # what the relay does once it has a replica
        one.go()
        replica.outstanding += 1  # the forwarder counts it from here
        return one

    def ended(one: Lane) -> None:
        replica.outstanding -= 1
        one.done()

    async def scenario() -> None:
        inter = lane("i")
        assert inter.admit(pool.replicas, None) is replica
        forwarded(inter)
        # One interactive request in flight: batch still gets both of its slots.
        b1, b2 = lane("b"), lane("b")
        assert b1.admit(pool.replicas, None) is replica
        assert b2.admit(pool.replicas, None) is replica
        forwarded(b1), forwarded(b2)
        assert replica.flow_in_flight == [1, 2] and replica.outstanding == 3
        b3 = lane("b")
        assert b3.admit(pool.replicas, None) is None  # batch is at its 2
        waiting = asyncio.ensure_future(b3.wait(never_disconnects))
        await asyncio.sleep(0)
        # The interactive request ends: its slot stays the higher class's.
        ended(inter)
        await asyncio.sleep(0)
        assert not waiting.done() and replica.flow_in_flight == [0, 2]
        again = lane("i")
        assert again.admit(pool.replicas, None) is replica
        forwarded(again)
        # A batch request ends: the queued one gets its slot.
        ended(b1)
        assert await asyncio.wait_for(waiting, 5) is replica
        for one in (forwarded(b3), b2, again):
            ended(one)
        assert replica.flow_in_flight == [0, 0] and replica.outstanding == 0

    asyncio.run(scenario())


def test_each_worker_enforces_its_share_of_the_in_flight_thresholds() -> None:
    s = parse(config(["http://127.0.0.1:9"], flow_control={
        "enabled": True, "default_class": "b", "saturation": {"in_flight": 8},
        "classes": [{"name": "a"}, {"name": "b", "saturation": {"in_flight": 5}}]}),
        {"VLLM_KEY": "x"}).flow_control
    shares = [[lim.in_flight for lim in s.for_worker(i, 3).limits()] for i in range(3)]
    assert shares == [[3, 2], [3, 2], [2, 1]]
    assert [sum(col) for col in zip(*shares, strict=True)] == [8, 5]
    assert s.limits() == s.thresholds() and s.workers == 1
    assert s.small_in_flight(6) == [("classes[1].saturation.in_flight", 5)]
    assert s.small_in_flight(5) == []
    with pytest.raises(ValueError, match="worker index 3"):
        s.for_worker(3, 3)


def _problems(**flow: object) -> str:
    with pytest.raises(InvalidConfig) as exc:
        parse(config(["http://127.0.0.1:9"], flow_control={"enabled": True, **flow}),
              {"VLLM_KEY": "x"})
    return str(exc.value)


def test_config_errors_name_the_key() -> None:
    assert "default_class: 'gold' is not a class" in _problems(default_class="gold")
    assert "keys.k1.class: 'vip' is not a class" in _problems(keys={"k1": {"class": "vip"}})
    assert ("classes[1].saturation.in_flight: 3 is higher than 2 of class 'a' (classes[0]); "
            "a lower class may not have higher thresholds") in _problems(
        classes=[{"name": "a", "saturation": {"in_flight": 2}},
                 {"name": "b", "saturation": {"in_flight": 3}}],
        default_class="a")
    # A threshold the lower class does not write is its default, not the class above's:
    # the problem names the threshold and says it is the default.
    assert ("classes[0].saturation.kv_usage: 0.9 (the default) is higher than 0.5 of the "
            "section's saturation") in _problems(
        saturation={"kv_usage": 0.5}, classes=[{"name": "a", "saturation": {"in_flight": 2}}],
        default_class="a")
    assert ("flow_control.vllm_priority_models[0]: 'default' is an alias of 'llama-3.1-8b'; "
            "list the model name") in _problems(vllm_priority_models=["default"])
    assert ("flow_control.vllm_priority_models[0]: 'lama' is not a model name (models: "
            "llama-3.1-8b, other-model)") in _problems(vllm_priority_models=["lama"])
    assert "classes[1].name: duplicate class 'a'" in _problems(
        classes=[{"name": "a"}, {"name": "a"}], default_class="a")


def test_a_prefill_threshold_needs_prefix_affinity_on_the_models_it_covers() -> None:
    # least_outstanding (the default strategy) keeps no prefill-token count: the threshold
    # would never be reached, so the config is refused, naming the threshold and the model.
    problem = _problems(classes=[{"name": "a"}, {"name": "b", "saturation": {
        "prefill_tokens": 4096}}], default_class="a")
    assert ("flow_control.classes[1].saturation.prefill_tokens: prefill tokens in flight are "
            "counted only for models with strategy prefix_affinity, and flow control covers "
            "'llama-3.1-8b', 'other-model' with another strategy; set their strategy to "
            "prefix_affinity or leave prefill_tokens out") in problem
    doc = config(["http://127.0.0.1:9"], flow_control={
        "enabled": True, "saturation": {"prefill_tokens": 4096}})
    for model in doc["models"]:
        model["strategy"] = "prefix_affinity"
    limits = parse(doc, {"VLLM_KEY": "x"}).flow_control.limits()
    assert [lim.prefill_tokens for lim in limits] == [4096, 4096, 4096]
    # A model flow control does not cover may keep its strategy.
    doc = config(["http://127.0.0.1:9"], flow_control={
        "enabled": True, "models": ["other-model"], "saturation": {"prefill_tokens": 4096}})
    doc["models"][1]["strategy"] = "prefix_affinity"
    assert doc["models"][1]["name"] == "other-model"
    flow = parse(doc, {"VLLM_KEY": "x"}).flow_control
    assert flow.covers("other-model") and not flow.covers("llama-3.1-8b")


def test_class_thresholds_are_inherited_from_the_class_above() -> None:
    s = parse(config(["http://127.0.0.1:9"], flow_control={
        "enabled": True, "default_class": "b", "saturation": {"queue_depth": 8},
        "classes": [{"name": "a"}, {"name": "b", "saturation": {"queue_depth": 2}},
                    {"name": "c"}]}), {"VLLM_KEY": "x"})
    assert [lim.queue_depth for lim in s.flow_control.limits()] == [8, 2, 2]
    assert s.flow_control.covers("llama-3.1-8b")
    assert not parse(config(["http://127.0.0.1:9"]), {"VLLM_KEY": "x"}).flow_control.covers("x")


def _gate(**flow: object) -> tuple[FlowGate, Router]:
    cfg = config(["http://127.0.0.1:9"], flow_control={"enabled": True, **flow})
    named = flow.get("keys")
    for key_id in named if isinstance(named, dict) else ():  # overrides must name a key
        cfg["keys"].append({"id": key_id, "sha256": sha(f"sg-{key_id}"), "models": ["*"]})
    s = parse(cfg, {"VLLM_KEY": "x"})
    router = Router(s)
    return FlowGate(s.flow_control, router, stale_s=2.0), router


def test_keys_of_a_team_share_one_flow_with_the_team_weight() -> None:
    gate, router = _gate(share_by="team", teams={"a": {"class": "batch", "weight": 3}},
                         keys={"solo": {"class": "interactive", "weight": 5}})
    pool = router.pools["llama-3.1-8b"]

    def lane(key: str, team: str | None,
             headers: list[tuple[bytes, bytes]] | None = None) -> Lane:
        body = parse_body(b'{"model": "llama-3.1-8b", "messages": []}')
        record = RequestRecord("r", 0.0, "POST", "/v1/chat/completions")
        out = gate.lane(Principal(key, team, "internal", frozenset({"*"})), pool,
                        headers or [], body, record)
        assert out is not None
        return out

    one, two = lane("k1", "a"), lane("k2", "a")
    assert (one.flow, one.weight, one.class_name) == ("a", 3, "batch")
    assert (two.flow, two.weight) == ("a", 3)
    solo = lane("solo", None)  # no team: its own flow; a key's class wins over its team's
    assert (solo.flow, solo.class_name) == ("solo", "interactive")
    assert lane("k3", None, [(b"x-priority", b" Batch ")]).class_name == "batch"


def test_only_the_listed_models_are_flow_controlled() -> None:
    gate, router = _gate(models=["other-model"])
    assert set(gate.pools) == {"other-model"}
    assert router.pools["other-model"].wants_signals
    assert not router.pools["llama-3.1-8b"].wants_signals
    body = parse_body(b'{"model": "llama-3.1-8b"}')
    assert gate.lane(Principal("k", None, "internal", frozenset({"*"})),
                     router.pools["llama-3.1-8b"], [], body,
                     RequestRecord("r", 0.0, "POST", "/v1/chat/completions")) is None


def test_a_cancelled_waiter_leaves_the_queue_and_gives_back_a_handed_over_replica() -> None:
    """The drain deadline cancels a queued request: nothing stays queued or reserved."""
    import asyncio

    gate, router = _gate(saturation={"in_flight": 1})
    pool = router.pools["llama-3.1-8b"]
    replica = pool.replicas[0]

    async def never_disconnects() -> dict[str, object]:
        await asyncio.Event().wait()
        return {}

    def lane() -> Lane:
        body = parse_body(b'{"model": "llama-3.1-8b"}')
        out = gate.lane(Principal("k", None, "internal", frozenset({"*"})), pool, [], body,
                        RequestRecord("r", 0.0, "POST", "/v1/chat/completions"))
        assert out is not None
        return out

    async def scenario() -> None:
        holder = lane()
        assert holder.admit(pool.replicas, None) is replica and replica.outstanding == 1
        # Cancelled while waiting: it leaves the queue.
        waiting = lane()
        assert waiting.admit(pool.replicas, None) is None
        task = asyncio.ensure_future(waiting.wait(never_disconnects))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sum(n for _, _, n in gate.queue_lengths()) == 0
        # Handed a replica, then cancelled before it could run: the replica is given back.
        late = lane()
        assert late.admit(pool.replicas, None) is None
        task = asyncio.ensure_future(late.wait(never_disconnects))
        await asyncio.sleep(0)
        holder.go()
        holder.done()  # the holder ends: the replica goes to the waiter (reserved)
        assert replica.outstanding == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert replica.outstanding == 0
        assert sum(n for _, _, n in gate.queue_lengths()) == 0

    asyncio.run(scenario())


def test_a_live_reload_keeps_queued_requests_on_the_pool_they_were_admitted_with() -> None:
    """A reload that changes a model's replicas: the new pool starts with empty queues, the
    request queued on the old pool is dispatched onto the old pool's replica when it frees."""
    import asyncio

    gate, router = _gate(saturation={"in_flight": 1})
    old_pool = router.pools["llama-3.1-8b"]
    old_replica = old_pool.replicas[0]
    reloaded = parse(config(["http://127.0.0.1:10"], flow_control={
        "enabled": True, "saturation": {"in_flight": 1}}), {"VLLM_KEY": "x"})
    new_router = Router(reloaded, reuse=router)
    new_pool = new_router.pools["llama-3.1-8b"]
    assert new_pool is not old_pool

    async def never_disconnects() -> dict[str, object]:
        await asyncio.Event().wait()
        return {}

    def lane(pool: object) -> Lane:
        body = parse_body(b'{"model": "llama-3.1-8b"}')
        out = gate.lane(Principal("k", None, "internal", frozenset({"*"})), pool,  # type: ignore[arg-type]
                        [], body, RequestRecord("r", 0.0, "POST", "/v1/chat/completions"))
        assert out is not None
        return out

    async def scenario() -> None:
        holder = lane(old_pool)
        assert holder.admit(old_pool.replicas, None) is old_replica
        waiting = lane(old_pool)
        assert waiting.admit(old_pool.replicas, None) is None
        task = asyncio.ensure_future(waiting.wait(never_disconnects))
        await asyncio.sleep(0)
        gate.rebind(new_router)
        assert gate.pools["llama-3.1-8b"].pool is new_pool
        # The new pool has room: a new request is dispatched at once to the new replica.
        fresh = lane(new_pool)
        assert fresh.admit(new_pool.replicas, None) is new_pool.replicas[0]
        # A request routed with the old snapshot after the swap queues with the old pool.
        assert lane(old_pool).admit(old_pool.replicas, None) is None
        holder.go()
        holder.done()
        assert await asyncio.wait_for(task, 5) is old_replica
        gate.kick_all()
        fresh.done()

    asyncio.run(scenario())


def test_pods_split_in_flight_and_refuse_a_threshold_below_their_count() -> None:
    fc = FlowControlSettings(enabled=True, pods=3, saturation=SaturationSettings(in_flight=8))
    assert fc.limits()[0].in_flight == 2  # 8 // 3
    workers = [fc.for_worker(i, 2) for i in range(2)]
    assert [w.limits()[0].in_flight for w in workers] == [1, 1]
    assert workers[0].processes == 6
    with pytest.raises(ValidationError, match="2 is less than pods 3"):
        FlowControlSettings(enabled=True, pods=3, saturation=SaturationSettings(in_flight=2))
