"""Fleet-aware routing (``prefix_affinity``): metrics parsing, prefix index, decisions, wiring."""

from __future__ import annotations

import random
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import httpx

from gateway.auth import Principal
from gateway.fleet import PrefixIndex, RoutingSettings, block_hashes, canonical_prompt
from gateway.fleet.model_settings import ModelSettings, ReplicaSettings
from gateway.fleet.replica_metrics import ReplicaSignals, parse_metrics
from gateway.routing import Pool, Replica, RouteDecision, Router
from tests.gateway.helpers import KEY_A, Recorder, settings, start_gateway, start_sim

AUTH_A = {"authorization": f"Bearer {KEY_A}"}

V1_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 750.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048"} 1.0
vllm:num_requests_waiting_by_reason{reason="x"} NaN
"""

OLD_PAGE = """\
vllm:num_requests_running{model_name="m"} 1.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.125
vllm:gpu_prefix_cache_queries_total{model_name="m"} 64.0
vllm:gpu_prefix_cache_hits_total{model_name="m"} 32.0
vllm:something_else 12
garbage line
"""


def test_parse_vllm_v1_metrics_sums_engines_and_reads_kv_capacity() -> None:
    s = parse_metrics(V1_PAGE, at=5.0)
    assert (s.running, s.waiting, s.kv_usage) == (5.0, 4.0, 0.375)
    assert (s.prefix_queries, s.prefix_hits) == (1000.0, 750.0)
    assert (s.num_gpu_blocks, s.block_size, s.kv_tokens) == (2048, 16, 32768)


def test_parse_older_metric_names_and_a_page_without_vllm() -> None:
    s = parse_metrics(OLD_PAGE, at=1.0)
    assert (s.running, s.kv_usage, s.prefix_queries, s.prefix_hits) == (1.0, 0.125, 64.0, 32.0)
    assert s.kv_tokens is None
    empty = parse_metrics("# nothing\nprocess_cpu_seconds_total 3\n", at=1.0)
    assert (empty.running, empty.waiting, empty.kv_usage) == (None, None, None)


def test_canonical_prompt_is_prefix_stable_across_turns() -> None:
    turn1 = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"}]}
    turn2 = {"messages": [*turn1["messages"], {"role": "assistant", "content": "a1"},
                          {"role": "user", "content": "q2"}]}
    one, two = canonical_prompt(turn1), canonical_prompt(turn2)
    assert one and two and two.startswith(one)
    tools = canonical_prompt({**turn1, "tools": [{"type": "function", "function": {"name": "f"}}]})
    assert tools and tools.startswith("tools") and tools.endswith(one)
    assert canonical_prompt({"prompt": "abc"}) == "abc"
    assert canonical_prompt({"input": "x"}) is None
    # Roles are part of the rendering: the same text as another role is another prompt.
    assert canonical_prompt({"messages": [{"role": "user", "content": "S"}]}) != \
        canonical_prompt({"messages": [{"role": "system", "content": "S"}]})


def test_block_hashes_are_chained_full_blocks() -> None:
    a = block_hashes("x" * 300, 128, 10_000)
    assert len(a) == 2  # the 44-character tail is not a full block
    b = block_hashes("y" + "x" * 299, 128, 10_000)
    assert a[1] != b[1]  # same characters 128..255, different prefix
    assert block_hashes("x" * 300, 128, 200) == a[:1]  # max_chars cuts


def test_prefix_index_matches_per_replica_and_evicts_lru_heads_last() -> None:
    idx = PrefixIndex(replicas=3, capacity=4)
    idx.insert(0, [1, 2, 3])
    idx.insert(2, [1, 2])
    assert idx.match([1, 2, 3, 9], 3) == [3, 0, 2]
    idx.insert(0, [7, 8])  # 5 entries > 4: the LRU entry goes: the tail 3 of the first prefix
    assert idx.size(0) == 4 and idx.match([1, 2, 3], 3) == [2, 0, 2]
    idx.set_capacity(2, 1)
    assert idx.match([1, 2], 3) == [2, 0, 1]  # replica 2 kept the head block
    idx.clear(0)
    assert idx.match([1, 2], 3) == [0, 0, 1] and idx.size(0) == 0


def test_prefix_index_agrees_with_a_per_replica_lru_model_under_random_traffic() -> None:
    """The shared ``hash -> replicas`` map and the joint walk give, for every replica, the
    leading blocks of the prompt present in a plain per-replica LRU (the reference), through
    inserts (with and without the match count), evictions, shrinking and clearing."""
    rng = random.Random(7)  # noqa: S311 - a reproducible workload, not a secret
    replicas, cap = 8, 40
    idx = PrefixIndex(replicas=replicas, capacity=cap)
    ref: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]
    caps = [cap] * replicas
    # Prompts: 6 system prompts alone and with 5 questions each, as chained hashes.
    prompts = []
    for system in range(6):
        head = "s" * 8 + str(system) * 8 * rng.randint(1, 12)  # whole 8-char blocks
        prompts.append(block_hashes(head, 8, 10_000))  # the head of the 5 prompts below
        for q in range(5):
            prompts.append(block_hashes(head + f"{system}-{q}" * 20, 8, 10_000))
    mismatches = 0
    prompt, r = prompts[0], 0
    for step in range(3000):
        if rng.random() < 0.7:  # else the same prompt again, often to the same replica
            prompt = rng.choice(prompts)
        got = idx.match(prompt, replicas)
        want = []
        for lru in ref:
            k = 0
            while k < len(prompt) and prompt[k] in lru:
                k += 1
            want.append(k)
        mismatches += got != want
        assert got == want, (step, got, want)
        if rng.random() < 0.7:
            r = rng.randrange(replicas)
        action = rng.random()
        if action < 0.9:
            # With the match count (as the strategy inserts) or without (probing each block).
            idx.insert(r, prompt, held=got[r] if rng.random() < 0.5 else None)
            for h in reversed(prompt):
                ref[r][h] = None
                ref[r].move_to_end(h)
        elif action < 0.97:
            caps[r] = rng.randint(1, cap)
            idx.set_capacity(r, caps[r])
        else:
            idx.clear(r)
            ref[r].clear()
        while len(ref[r]) > caps[r]:
            ref[r].popitem(last=False)
        assert idx.size(r) == len(ref[r])
    assert mismatches == 0 and any(idx.size(r) for r in range(replicas))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pool(n: int, clock: Clock, **routing: Any) -> Pool:
    model = ModelSettings(
        name="m", strategy="prefix_affinity",
        replicas=[ReplicaSettings(url=f"http://10.0.0.{i}:8000") for i in range(n)],
    )
    return Pool(model, cooldown_s=10.0, clock=clock, routing=RoutingSettings(**routing))


def _chat(system: str, question: str) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}]}


def _route(p: Pool, body: dict[str, Any], candidates: Sequence[Replica] | None = None,
           headers: Sequence[tuple[bytes, bytes]] = (),
           started: bool = True) -> tuple[Replica, dict[str, Any]]:
    """Route ``body``; ``started``: its response starts at once (its prefill is over)."""
    hint = p.route_hint(body, headers)
    assert hint is not None
    r = p.pick(candidates, hint=hint)
    assert r is not None and hint.explain is not None
    if started:
        hint.release()
    return r, hint.explain


def test_repeated_prefix_goes_to_its_holder_and_groups_spread() -> None:
    p = _pool(4, Clock())
    first: dict[int, Replica] = {}
    hints = []
    for g in range(4):
        hint = p.route_hint(_chat(f"group {g} " * 200, "q0"), ())
        assert hint is not None
        first[g] = r = p.pick(hint=hint)  # type: ignore[assignment]
        hints.append(hint)  # its prefill is still queued there: the next cold group moves on
    assert len({r.index for r in first.values()}) == 4  # cold groups spread over the replicas
    for hint in hints:
        hint.release()
    for g in range(4):
        r, why = _route(p, _chat(f"group {g} " * 200, f"another question {g}"))
        assert r is first[g]
        assert why["reason"] == "prefix" and why["matched_blocks"] >= 12
        assert why["prompt_blocks"] >= why["matched_blocks"]


def test_pods_that_never_saw_a_prefix_send_it_to_the_same_replica() -> None:
    """Three gateway pods, each with its own history (other prompts indexed, another turn
    counter): a new prefix group is placed on the same replica whichever pod its first
    requests land on, and stays there on every pod (the rendezvous tie-break)."""
    pods = [_pool(4, Clock()) for _ in range(3)]
    for k, pod in enumerate(pods):  # different pasts: other prompts, other turn counters
        for j in range(k * 3 + 1):
            _route(pod, _chat(f"pod {k} history {j} " * 50, "q"))
    for g in range(24):
        system = f"tenant {g} system prompt " * 40
        placed = {_route(pod, _chat(system, f"question {g} from pod {k}"))[1]["replica"]
                  for k, pod in enumerate(pods)}
        assert len(placed) == 1, (g, placed)
        # A later request of the group: each pod holds it in its own estimate now.
        again = [_route(pod, _chat(system, f"follow-up {g}"))[1] for pod in pods]
        assert {why["replica"] for why in again} == placed
        assert {why["reason"] for why in again} == {"prefix"}


def test_rendezvous_spreads_new_prefixes_and_yields_to_load() -> None:
    p = _pool(4, Clock())
    counts = [0, 0, 0, 0]
    for g in range(400):
        r, why = _route(p, _chat(f"random prompt {g} " * 20, "q"))
        counts[r.index] += 1
        assert why["tied"] == 4 and why["reason"] == "load"
    assert all(60 <= c <= 140 for c in counts), counts  # 100 each expected
    # A replica busier than the tolerance allows is not tied any more, whatever its hash says.
    body = _chat("one more new prompt " * 20, "q")
    home = _route(_pool(4, Clock()), body)[0].index  # where it goes on an idle fleet
    busy = _pool(4, Clock())
    busy.replicas[home].outstanding = 2
    r, why = _route(busy, body)
    assert r.index != home and why["tied"] == 3
    # tie_tolerance 0: only candidates exactly as good on cache and queued prefill are tied.
    for tolerance, tied in ((0.1, 2), (0.0, 1)):
        q = _pool(2, Clock(), tie_tolerance=tolerance)
        q.replicas[0].prefill_tokens = q.replicas[1].prefill_tokens = 1.0
        q.replicas[0].prefill_tokens = 2.0  # a little more queued prefill there
        assert _route(q, body)[1]["tied"] == tied


def test_load_beats_a_small_prefix_and_the_imbalance_guard_overrides_a_large_one() -> None:
    p = _pool(2, Clock())
    holder, _ = _route(p, _chat("shared " * 300, "q"))
    other = p.replicas[1 - holder.index]
    holder.outstanding = 3
    r, _ = _route(p, _chat("shared " * 300, "q2"))
    assert r is holder  # a 3-request queue is worth less than re-using the whole prefix
    holder.outstanding = 12  # >= 8 more than the other and > 2 x (0 + 1)
    r, why = _route(p, _chat("shared " * 300, "q3"))
    assert r is other and why["reason"] == "imbalance"
    assert (why["load"], why["least_load"]) == (0.0, 0.0)


def test_a_holder_busy_only_decoding_keeps_its_warm_requests() -> None:
    """Decoding requests barely delay a new prefill: only a large imbalance moves a prefix."""
    p = _pool(4, Clock())
    holder, _ = _route(p, _chat("group " * 400, "q0"))
    holder.outstanding = 6  # six requests decoding there, none elsewhere, nothing queued
    r, why = _route(p, _chat("group " * 400, "q1"))
    assert r is holder and why["reason"] == "prefix" and why["prefill_tokens"] == 0
    holder.outstanding = 9  # 9 > 2 x (0 + 1) and 9 - 0 >= 8: the imbalance guard moves it
    r, why = _route(p, _chat("group " * 400, "q2"))
    assert r is not holder and why["reason"] == "imbalance"


def test_queued_uncached_prefill_tokens_steer_until_the_response_starts() -> None:
    p = _pool(3, Clock(), tie_tolerance=0.0)  # the prefill term alone (no near-ties)
    a, b, c = p.replicas
    long_cold = _chat("x" * 8000, "cold")  # ~2,000 uncached tokens at 4 characters per token
    hint = p.route_hint(long_cold, ())
    assert hint is not None and hint.tokens > 2000
    first = p.pick(hint=hint)
    assert first is not None and first.prefill_tokens == hint.charged == hint.tokens
    # Replicas without queued prefill win, even with more requests in flight (decoding).
    others = [r for r in p.replicas if r is not first]
    others[0].outstanding = others[1].outstanding = 1
    r, why = _route(p, _chat("y" * 800, "another"), started=False)
    assert r in others and why["prefill_tokens"] == 0
    # A prompt whose prefix ``first`` holds: its own uncached part is small, but when the
    # prefill queued there is much longer than the whole prompt, another replica is faster.
    first.prefill_tokens += 6000.0  # three more cold prompts of other requests queued there
    r2, _ = _route(p, _chat("x" * 8000, "warm"))
    assert r2 is not first
    first.prefill_tokens -= 6000.0
    hint.release()  # the first response started: its prefill is over
    hint.release()  # idempotent
    assert first.prefill_tokens == 0.0
    r3, why3 = _route(p, _chat("x" * 8000, "warm again"))
    assert r3 is first and why3["reason"] == "prefix"
    assert {a, b, c} == set(p.replicas)


def test_scraped_queue_counts_until_stale_then_local_counts_rule() -> None:
    clock = Clock()
    p = _pool(2, clock, metrics_stale_s=2.0)
    a, b = p.replicas
    a.observe(ReplicaSignals(at=clock.now, waiting=20.0, running=5.0, kv_usage=0.9))
    b.observe(ReplicaSignals(at=clock.now, waiting=0.0, running=1.0, kv_usage=0.1))
    r, why = _route(p, _chat("fresh", "q"))
    assert r is b and (why["waiting"], why["running"]) == (0.0, 1.0)
    assert p.affinity is not None and p.affinity.load(a, clock.now) == 25.0
    b.outstanding = 2  # sent since the scrape: added to the scraped figures
    assert p.affinity.load(b, clock.now) == 3.0
    clock.now += 3.0  # both scrapes are stale now: local in-flight counts only
    assert p.affinity.load(a, clock.now) == 0.0
    r, why = _route(p, _chat("other", "q"))
    assert r is a and why["waiting"] is None and why["signals_age_s"] == 3.0


def test_only_policy_allowed_candidates_are_chosen() -> None:
    p = _pool(3, Clock())
    holder, _ = _route(p, _chat("secret prefix " * 100, "q"))
    allowed = [r for r in p.replicas if r is not holder]
    for i in range(5):
        r, _ = _route(p, _chat("secret prefix " * 100, f"q{i}"), candidates=allowed)
        assert r in allowed
    # ... and unavailable ones are skipped even when they hold the prefix.
    holder2, _ = _route(p, _chat("another " * 100, "q"))
    p.eject(holder2)
    r, _ = _route(p, _chat("another " * 100, "q2"))
    assert r is not holder2


def test_session_affinity_is_consistent_and_load_bounded() -> None:
    p = _pool(4, Clock(), session_affinity=True)
    body = {**_chat("s", "q"), "user": "alice"}
    home, why = _route(p, body)
    assert why["reason"] == "session"
    assert all(_route(p, {**_chat("x", str(i)), "user": "alice"})[0] is home for i in range(5))
    by_header, _ = _route(p, _chat("s", "q"), headers=[(b"x-session-id", b"alice")])
    assert by_header is home
    home.outstanding = 10  # over ceil(1.25 * (10 + 1) / 4) = 4: the session moves on
    moved, _ = _route(p, body)
    assert moved is not home
    users = {_route(p, {**_chat("s", "q"), "user": f"u{i}"})[0].index for i in range(40)}
    assert len(users) >= 3  # sessions spread over the ring


def test_retries_without_hint_pick_least_outstanding() -> None:
    p = _pool(2, Clock())
    p.replicas[0].outstanding = 3
    assert p.pick() is p.replicas[1]
    assert p.pick(exclude=[p.replicas[1]]) is p.replicas[0]


# -- wired into the app, against simulated vLLM replicas with the engine model ------------------


def _metric(page: str, name: str) -> float:
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", page, re.M):
        total += float(m.group(1))
    return total


def _wait(pred: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _fleet(serve_asgi: Any, n: int = 2, **routing: Any) -> tuple[list[Any], Any]:
    sims = [start_sim(serve_asgi, profile="tiny-test", num_gpu_blocks=512) for _ in range(n)]
    s = settings([x.url for x in sims], routing={"metrics_interval_s": 0.05, **routing})
    model = s.models[0].model_copy(update={"strategy": "prefix_affinity"})
    return sims, s.model_copy(update={"models": [model, *s.models[1:]]})


def test_gateway_scrapes_metrics_and_sends_a_repeated_prefix_to_its_holder(
    serve_asgi: Any,
) -> None:
    sims, s = _fleet(serve_asgi)
    router = Router(s)
    recorder = Recorder()
    gw = start_gateway(serve_asgi, s, router=router, observers=[recorder])
    replicas = router.pools["llama-3.1-8b"].replicas
    _wait(lambda: all(r.signals is not None for r in replicas))
    assert all(r.signals and r.signals.kv_tokens == 512 * 16 for r in replicas)

    system = " ".join(f"word{i}" for i in range(300))
    for i in range(4):
        body = {"model": "llama-3.1-8b", "max_tokens": 4,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": f"question {i}"}]}
        assert httpx.post(gw + "/v1/chat/completions", json=body, headers=AUTH_A).is_success
    records = recorder.wait(4)
    holder = records[0].replica_url
    assert all(r.replica_url == holder for r in records)
    assert records[0].route and records[0].route["matched_blocks"] == 0
    assert all(r.route and r.route["matched_blocks"] >= 10 for r in records[1:])
    pages = {x.url: httpx.get(x.url + "/metrics").text for x in sims}
    assert _metric(pages[holder], "vllm:prefix_cache_hits_total") >= 3 * 300
    other = next(u for u in pages if u != holder)
    assert _metric(pages[other], "vllm:prefix_cache_queries_total") == 0
    assert all(r.prefill_tokens == 0.0 for r in replicas)  # every prefill was released

    # A stream's uncached tokens count until its first byte, not until its end.
    body = {"model": "llama-3.1-8b", "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": "cold " * 400}]}
    with httpx.stream("POST", gw + "/v1/chat/completions", json=body, headers=AUTH_A) as resp:
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        busy = [r for r in replicas if r.outstanding]
        assert len(busy) == 1 and busy[0].prefill_tokens == 0.0
        for _ in lines:
            pass


class OnlyDestination:
    """An egress-policy stand-in that allows replicas of one destination id."""

    def __init__(self, destination: str) -> None:
        self.destination = destination

    def decide(self, principal: Principal, model: ModelSettings,
               replicas: Sequence[Replica]) -> RouteDecision:
        return RouteDecision(tuple(r for r in replicas if r.destination == self.destination))


def test_prefix_holder_outside_the_policy_is_never_chosen(serve_asgi: Any) -> None:
    sims, s = _fleet(serve_asgi)
    model = s.models[0]
    reps = [r.model_copy(update={"destination": d})
            for r, d in zip(model.replicas, ["us-1", "eu-2"], strict=True)]
    s = s.model_copy(update={"models": [model.model_copy(update={"replicas": reps}),
                                        *s.models[1:]]})
    # Warm replica 0 (us-1) with the prefix directly: the index learns nothing of it.
    body = {"model": "llama-3.1-8b", "max_tokens": 2,
            "messages": [{"role": "system", "content": "p " * 400}]}
    assert httpx.post(sims[0].url + "/v1/chat/completions",
                      json={**body, "model": "meta-llama/Llama-3.1-8B-Instruct"}).is_success
    gw = start_gateway(serve_asgi, s, policy=OnlyDestination("eu-2"))
    for _ in range(3):
        assert httpx.post(gw + "/v1/chat/completions", json=body, headers=AUTH_A).is_success
    assert sims[0].stats()["received"] == 1 and sims[1].stats()["received"] == 3


def test_a_failing_metrics_endpoint_never_fails_a_request(serve_asgi: Any) -> None:
    sims, s = _fleet(serve_asgi)
    for x in sims:
        x.fault(mode="status_500", paths=["/metrics"])
    router = Router(s)
    recorder = Recorder()
    gw = start_gateway(serve_asgi, s, router=router, observers=[recorder])
    _wait(lambda: sims[0].stats()["faults_applied"] >= 2)  # scraped and failed
    body = {"model": "llama-3.1-8b", "max_tokens": 2,
            "messages": [{"role": "user", "content": "hello"}]}
    for _ in range(3):
        assert httpx.post(gw + "/v1/chat/completions", json=body, headers=AUTH_A).is_success
    for rec in recorder.wait(3):
        assert rec.route and rec.route["waiting"] is None and rec.route["signals_age_s"] is None


def test_admin_metrics_export_replica_signals_and_routing_outcomes() -> None:
    from opentelemetry.sdk.resources import Resource
    from prometheus_client import CollectorRegistry, generate_latest

    from gateway.relay.records import RequestRecord
    from gateway.telemetry.metrics import GatewayMetrics
    from gateway.telemetry.prometheus import PrometheusCollector

    s = settings(["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    model = s.models[0].model_copy(update={"strategy": "prefix_affinity"})
    router = Router(s.model_copy(update={"models": [model, *s.models[1:]]}))
    a, _ = router.pools["llama-3.1-8b"].replicas
    a.observe(ReplicaSignals(at=time.monotonic(), waiting=2.0, running=3.0, kv_usage=0.5))
    a.prefill_tokens = 1500.0
    metrics = GatewayMetrics(Resource.create({"service.name": "t"}), router)
    rec = RequestRecord(request_id="r", started_at=0.0, method="POST",
                        path="/v1/chat/completions", canonical_model="llama-3.1-8b",
                        status=200, outcome="ok",
                        route={"reason": "prefix", "matched_blocks": 6, "prompt_blocks": 8})
    metrics.record_request(rec)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrometheusCollector(metrics.set))
    page = generate_latest(registry).decode()
    assert re.search(r'sg_gateway_replica_waiting\{[^}]*http://10\.0\.0\.1:8000[^}]*\} 2\.0', page)
    assert re.search(r'sg_gateway_replica_kv_usage_ratio\{[^}]*10\.0\.0\.1[^}]*\} 0\.5', page)
    assert "sg_gateway_replica_signals_age_seconds" in page
    assert re.search(r'sg_gateway_replica_prefill_tokens\{[^}]*10\.0\.0\.1[^}]*\} 1500\.0', page)
    assert not re.search(r'sg_gateway_replica_waiting\{[^}]*10\.0\.0\.2', page)  # never scraped
    assert re.search(r'sg_gateway_routing_decisions_total\{[^}]*reason="prefix"[^}]*\} 1\.0',
                     page)
    assert re.search(r'sg_gateway_routing_matched_blocks_total\{[^}]*\} 6\.0', page)


def test_token_blocks_with_a_configured_tokenizer(tmp_path: Any) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(64)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))  # noqa: S106 - not a secret
    tok.pre_tokenizer = Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    p = _pool(2, Clock(), tokenizer_file=path, block_tokens=4)
    body = {"prompt": " ".join(f"w{i}" for i in range(10))}
    hint = p.route_hint(body, ())
    assert hint is not None and len(hint.hashes) == 2  # 10 tokens: two full blocks of 4
    r, _ = _route(p, body)
    again, why = _route(p, {"prompt": " ".join(f"w{i}" for i in range(9)) + " w63"})
    assert again is r and why["matched_blocks"] == 2


def test_unloadable_tokenizer_is_named(tmp_path: Any) -> None:
    import pytest

    bad = tmp_path / "tok.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"routing\.tokenizer_file .*tok\.json: cannot load"):
        _pool(1, Clock(), tokenizer_file=bad)


def test_only_vllm_replicas_of_prefix_affinity_pools_are_scraped() -> None:
    from gateway.fleet import MetricsScraper

    s = settings(["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    first = s.models[0]
    reps = [first.replicas[0],
            first.replicas[1].model_copy(update={"kind": "litellm", "litellm_model": "x/y"})]
    pa = first.model_copy(update={"strategy": "prefix_affinity", "replicas": reps})
    router = Router(s.model_copy(update={"models": [pa, *s.models[1:]]}))
    scraper = MetricsScraper(router, session=None, settings=s.routing)  # type: ignore[arg-type]
    assert [r.url for r in scraper.replicas()] == ["http://10.0.0.1:8000"]  # not litellm, not LO
    assert scraper.needed
    plain = Router(s)
    assert not MetricsScraper(plain, None, s.routing).needed  # type: ignore[arg-type]


def test_a_request_refused_after_the_decision_gives_its_prefill_estimate_back(
    serve_asgi: Any,
) -> None:
    """An admission hook (quotas) refuses after the replica was chosen: the uncached prompt
    tokens charged to that replica are taken off again (else the replica looks busy forever)."""
    from collections.abc import Mapping

    from gateway.errors import RateLimited
    from gateway.relay.records import RequestRecord

    class RefuseAll:
        async def admit(self, record: RequestRecord, body: Mapping[str, Any]) -> None:
            raise RateLimited("refused for the test")

    _, s = _fleet(serve_asgi)
    router = Router(s)
    gw = start_gateway(serve_asgi, s, router=router, admission=[RefuseAll()])
    body = {"model": "llama-3.1-8b", "max_tokens": 4,
            "messages": [{"role": "user", "content": "cold " * 400}]}
    for _ in range(3):
        assert httpx.post(gw + "/v1/chat/completions", json=body,
                          headers=AUTH_A).status_code == 429
    assert all(r.prefill_tokens == 0.0 for r in router.pools["llama-3.1-8b"].replicas)
