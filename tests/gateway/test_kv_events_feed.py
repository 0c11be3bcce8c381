"""KV-cache events end to end: simulated vLLM replicas publish over ZMQ on loopback, the gateway
follows them (gaps replayed), routes on the exact state and falls back to its estimate."""

from __future__ import annotations

import asyncio
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import zmq.asyncio
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest

from gateway.fleet.exact_index import ExactIndex, content_keys
from gateway.fleet.kv_subscriber import KVEventSubscriber
from gateway.fleet.replica_metrics import signal_rows
from gateway.fleet.settings import KVEventsSource
from gateway.routing import Router
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prometheus import PrometheusCollector
from tests.gateway.helpers import KEY_A, SERVED, Recorder, settings, start_gateway, start_sim

AUTH_A = {"authorization": f"Bearer {KEY_A}"}

BLOCK = 16  # the tiny-test profile's block size


def _events_sim(serve_asgi: Any, replay: bool = True,
                time_scale: float = 1.0) -> tuple[Any, KVEventsSource]:
    ev = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*"}
    if replay:
        ev["replay_endpoint"] = "tcp://127.0.0.1:*"
    sim = start_sim(serve_asgi, profile="tiny-test", num_gpu_blocks=512, kv_events=ev,
                    time_scale=time_scale)
    bound = sim.stats()["kv_events"]
    return sim, KVEventsSource(replica=sim.url, endpoint=bound["endpoint"],
                               replay_endpoint=bound["replay_endpoint"], replay_timeout_s=5)


def _complete(url: str, ids: list[int], headers: dict[str, str] | None = None,
              model: str = SERVED) -> httpx.Response:
    r = httpx.post(url + "/v1/completions", headers=headers, timeout=10,
                   json={"model": model, "prompt": ids, "max_tokens": 2})
    assert r.is_success, r.text
    return r


def _cached(sim: Any, ids: list[int]) -> int:
    r = httpx.post(sim.url + "/sim/prefix", json={"model": SERVED, "prompt": ids}, timeout=5)
    return int(r.json()["cached_tokens"])


async def _until(pred: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _prompt(seed: int, n: int = 100) -> list[int]:
    return [seed * 1000 + i for i in range(n)]


_CTX: list[zmq.asyncio.Context] = []


async def _follow(source: KVEventsSource, idx: ExactIndex) -> KVEventSubscriber:
    ctx = zmq.asyncio.Context()
    _CTX.append(ctx)
    sub = KVEventSubscriber(source, lambda evs: idx.apply(0, evs), lambda: idx.clear(0), ctx)
    sub.start()
    return sub


async def _stop(sub: KVEventSubscriber) -> None:
    await sub.stop()
    _CTX.pop().term()


def _held(idx: ExactIndex, ids: list[int]) -> int:
    return idx.match(content_keys(ids[:-1], BLOCK), [0])[0] * BLOCK


def test_late_subscriber_catches_up_by_replay_and_a_gap_is_filled(serve_asgi: Any) -> None:
    sim, source = _events_sim(serve_asgi)
    first = _prompt(1)
    _complete(sim.url, first)  # cached before anyone subscribed

    async def run() -> None:
        idx = ExactIndex(1)
        sub = await _follow(source, idx)
        try:
            second = _prompt(2)
            await asyncio.to_thread(_complete, sim.url, second)
            await _until(lambda: _held(idx, second) == _cached(sim, second) > 0)
            # The first prompt's batches came from the replay buffer (seq 0 expected first).
            assert _held(idx, first) == _cached(sim, first) == 96
            assert sub.stats.replayed >= 1 and sub.exact() and sub.stats.gaps_lost == 0
            gaps = sub.stats.gaps

            # A batch lost on the PUB socket: the next one reveals the gap, replay fills it.
            r = httpx.post(sim.url + "/sim/kv_events/drop", json={"count": 1})
            assert r.is_success
            third, fourth = _prompt(3), _prompt(4)
            await asyncio.to_thread(_complete, sim.url, third)
            await asyncio.to_thread(_complete, sim.url, fourth)
            await _until(lambda: _held(idx, fourth) == 96)
            assert _held(idx, third) == _cached(sim, third) == 96
            assert sub.stats.gaps == gaps + 1 and sub.stats.gaps_lost == 0
            assert sub.stats.restarts == 0
        finally:
            await _stop(sub)

    asyncio.run(run())


def test_a_gap_without_replay_rebuilds_the_index(serve_asgi: Any) -> None:
    sim, source = _events_sim(serve_asgi, replay=False)

    async def run() -> None:
        idx = ExactIndex(1)
        sub = await _follow(source, idx)
        try:
            # Without replay, batches published before the SUB socket joined are missed: warm up
            # with fresh prompts until one batch has arrived.
            warm = iter(range(100, 1000))
            await _until(lambda: (_complete(sim.url, _prompt(next(warm))),
                                  sub.stats.batches > 0)[1])
            first = _prompt(1)
            await asyncio.to_thread(_complete, sim.url, first)
            await _until(lambda: _held(idx, first) == 96)
            httpx.post(sim.url + "/sim/kv_events/drop", json={"count": 1}).raise_for_status()
            second, third = _prompt(2), _prompt(3)
            await asyncio.to_thread(_complete, sim.url, second)
            await asyncio.to_thread(_complete, sim.url, third)
            await _until(lambda: _held(idx, third) == 96)
            # Without replay the lost batch cannot be recovered: everything before is forgotten
            # rather than trusted with a hole.
            assert sub.stats.gaps_lost == 1
            assert _held(idx, first) == 0 and _held(idx, second) == 0
        finally:
            await _stop(sub)

    asyncio.run(run())


def test_gateway_routes_on_the_exact_state_and_falls_back_without_events(
    serve_asgi: Any,
) -> None:
    (a, src_a), (b, src_b) = _events_sim(serve_asgi), _events_sim(serve_asgi)
    plain = start_sim(serve_asgi, profile="tiny-test", num_gpu_blocks=512)  # publishes nothing
    s = settings([a.url, b.url, plain.url],
                 routing={"metrics_interval_s": 0.05, "kv_events": [src_a, src_b]})
    model = s.models[0].model_copy(update={"strategy": "prefix_affinity"})
    s = s.model_copy(update={"models": [model, *s.models[1:]]})
    router = Router(s)
    recorder = Recorder()
    gw = start_gateway(serve_asgi, s, router=router, observers=[recorder])
    pool = router.pools["llama-3.1-8b"]
    aff = pool.affinity
    assert aff is not None

    # Warm one replica directly (not through the gateway: its estimate knows nothing of it).
    head = _prompt(7, 160)
    _complete(b.url, head)
    deadline = time.monotonic() + 10
    while aff.cache_state(1) != "exact" or aff.exact.size(1) < 9:
        assert time.monotonic() < deadline, "events of replica b not applied"
        time.sleep(0.02)
    assert aff.cache_state(2) == "estimate"  # no events configured: the estimate is used

    # Same prefix, new tail, through the gateway: the exact index sends it to b.
    _complete(gw, [*head, 1, 2, 3], AUTH_A, "llama-3.1-8b")
    rec = recorder.wait(1)[0]
    assert rec.replica_url == b.url
    assert rec.route is not None
    assert rec.route["cache_state"] == "exact" and rec.route["reason"] == "prefix"
    assert rec.route["cached_tokens"] == _cached(b, [*head, 1, 2, 3]) == 160

    # A chat prompt has no token ids the gateway can know: the estimate decides.
    r = httpx.post(gw + "/v1/chat/completions", headers=AUTH_A, timeout=10, json={
        "model": "llama-3.1-8b", "max_tokens": 2,
        "messages": [{"role": "user", "content": "hello " * 50}]})
    assert r.is_success
    assert recorder.wait(2)[1].route["cache_state"] == "estimate"  # type: ignore[index]

    rows = {r.url: row for r, row in signal_rows(router, time.monotonic())
            if r.model == "llama-3.1-8b"}
    assert rows[b.url]["cache_exact"] == 1.0 and rows[plain.url]["cache_exact"] == 0.0
    assert rows[b.url]["exact_blocks"] == float(aff.exact.size(1)) >= 10
    assert aff.describe(pool.replicas[1])["kv_events"]["batches"] >= 1

    # The admin port's Prometheus page shows which state each replica is scored from.
    metrics = GatewayMetrics(Resource.create({"service.name": "t"}), router)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrometheusCollector(metrics.set))
    page = generate_latest(registry).decode()
    def gauge(name: str, url: str) -> float:
        m = re.search(rf'{name}\{{[^}}]*"{re.escape(url)}"[^}}]*\}} (\S+)', page)
        assert m is not None, (name, url)
        return float(m.group(1))
    assert gauge("sg_gateway_replica_cache_exact", b.url) == 1.0
    assert gauge("sg_gateway_replica_cache_exact", plain.url) == 0.0
    assert gauge("sg_gateway_replica_exact_blocks", b.url) >= 10


def test_every_gateway_pod_follows_the_same_events_and_picks_the_same_holder(
    serve_asgi: Any,
) -> None:
    """Two gateways (two pods) over the same two replicas: a prefix cached through pod 1 is
    known to pod 2 from the replica's events, so pod 2 sends the next turn to the same holder
    although it never routed that prefix itself."""
    (a, src_a), (b, src_b) = _events_sim(serve_asgi), _events_sim(serve_asgi)
    s = settings([a.url, b.url],
                 routing={"metrics_interval_s": 0.05, "kv_events": [src_a, src_b]})
    model = s.models[0].model_copy(update={"strategy": "prefix_affinity"})
    s = s.model_copy(update={"models": [model, *s.models[1:]]})
    pods = []
    for _ in range(2):
        router, rec = Router(s), Recorder()
        pods.append((start_gateway(serve_asgi, s, router=router, observers=[rec]), router, rec))
    head = _prompt(9, 200)
    _complete(pods[0][0], [*head, 1], AUTH_A, "llama-3.1-8b")
    holder = pods[0][2].wait(1)[0].replica_url
    aff2 = pods[1][1].pools["llama-3.1-8b"].affinity
    assert aff2 is not None
    i = [a.url, b.url].index(holder)
    deadline = time.monotonic() + 10
    while aff2.exact.size(i) < 12:
        assert time.monotonic() < deadline, "pod 2 did not see the holder's events"
        time.sleep(0.02)
    _complete(pods[1][0], [*head, 2], AUTH_A, "llama-3.1-8b")
    rec2 = pods[1][2].wait(1)[0]
    assert rec2.replica_url == holder
    assert rec2.route is not None and rec2.route["cache_state"] == "exact"
    assert rec2.route["cached_tokens"] == 192


def test_pods_send_a_new_prefix_to_one_replica_before_any_event_tells_them(
    serve_asgi: Any,
) -> None:
    """Two gateway pods with different pasts get the first requests of a new prefix at the same
    time, before any BlockStored event can show where it went: both pick the same replica (the
    rendezvous tie-break), so the prefix is prefilled and cached once, not once per pod."""
    sims = [_events_sim(serve_asgi) for _ in range(3)]
    urls = [sim.url for sim, _ in sims]
    s = settings(urls, routing={"metrics_interval_s": 0.05,
                                "kv_events": [src for _, src in sims]})
    model = s.models[0].model_copy(update={"strategy": "prefix_affinity"})
    s = s.model_copy(update={"models": [model, *s.models[1:]]})
    pods = []
    for _ in range(2):
        router, rec = Router(s), Recorder()
        pods.append((start_gateway(serve_asgi, s, router=router, observers=[rec]), rec))
    for k in range(2):  # pod 2 has routed other prompts: another turn counter, other counts
        _complete(pods[1][0], _prompt(50 + k, 40), AUTH_A, "llama-3.1-8b")
    pods[1][1].wait(2)
    with ThreadPoolExecutor(2) as pool:
        for k in range(6):
            head = _prompt(60 + k, 96)
            sent = [pool.submit(_complete, url, [*head, i], AUTH_A, "llama-3.1-8b")
                    for i, (url, _) in enumerate(pods)]
            for fut in sent:
                fut.result()
            first, second = pods[0][1].wait(k + 1)[k], pods[1][1].wait(k + 3)[k + 2]
            assert first.replica_url == second.replica_url, k


def test_chat_prompts_are_matched_exactly_with_the_replicas_tokenizer(serve_asgi: Any) -> None:
    """routing.tokenize: replica: a chat prompt's ids come from a replica's /tokenize (its chat
    template), so chat requests are routed on the exact state too."""
    (a, src_a), (b, src_b) = _events_sim(serve_asgi), _events_sim(serve_asgi)
    s = settings([a.url, b.url], routing={"metrics_interval_s": 0.05, "tokenize": "replica",
                                          "kv_events": [src_a, src_b]})
    model = s.models[0].model_copy(update={"strategy": "prefix_affinity"})
    s = s.model_copy(update={"models": [model, *s.models[1:]]})
    router, recorder = Router(s), Recorder()
    gw = start_gateway(serve_asgi, s, router=router, observers=[recorder])
    aff = router.pools["llama-3.1-8b"].affinity
    assert aff is not None
    system = " ".join(f"rule{i}" for i in range(200))

    def chat(question: str) -> dict[str, Any]:
        return {"model": SERVED, "max_tokens": 2,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": question}]}

    assert httpx.post(b.url + "/v1/chat/completions", json=chat("warm"), timeout=10).is_success
    deadline = time.monotonic() + 10
    while aff.exact.size(1) < 12:
        assert time.monotonic() < deadline, "events of replica b not applied"
        time.sleep(0.02)
    body = {**chat("a new question"), "model": "llama-3.1-8b"}
    expected = int(httpx.post(b.url + "/sim/prefix", json=chat("a new question")).json()[
        "cached_tokens"])
    r = httpx.post(gw + "/v1/chat/completions", json=body, headers=AUTH_A, timeout=10)
    assert r.is_success
    rec = recorder.wait(1)[0]
    assert rec.replica_url == b.url and rec.route is not None
    assert rec.route["cache_state"] == "exact" and rec.route["cached_tokens"] == expected > 190


def test_a_second_request_follows_a_first_whose_blocks_are_not_stored_yet(
    serve_asgi: Any,
) -> None:
    """A new prefix's first request is still prefilling (its replica has published no
    BlockStored yet) when the second of its group arrives: the pending overlay sends the second
    to the same replica, as a prefix hit (``pending_tokens``), and the replica's events then
    confirm the blocks (the overlay empties)."""
    # Prefill at 1/50 speed: a 400-token prompt prefills for ~1 s.
    sims = [_events_sim(serve_asgi, time_scale=50.0) for _ in range(3)]
    for k, (sim, _) in enumerate(sims):
        _complete(sim.url, _prompt(90 + k, 32))  # one batch (replayed): the feed is in sync
    s = settings([sim.url for sim, _ in sims],
                 routing={"metrics_interval_s": 0.05, "kv_events": [src for _, src in sims]})
    model = s.models[0].model_copy(update={"strategy": "prefix_affinity"})
    s = s.model_copy(update={"models": [model, *s.models[1:]]})
    router, recorder = Router(s), Recorder()
    gw = start_gateway(serve_asgi, s, router=router, observers=[recorder])
    pool = router.pools["llama-3.1-8b"]
    aff = pool.affinity
    assert aff is not None
    deadline = time.monotonic() + 10
    while not all(aff.cache_state(i) == "exact" for i in range(3)):
        assert time.monotonic() < deadline, "subscribers not in sync"
        time.sleep(0.02)
    head = _prompt(77, 400)
    with ThreadPoolExecutor(1) as ex:
        first = ex.submit(_complete, gw, [*head, 1], AUTH_A, "llama-3.1-8b")
        while sum(r.outstanding for r in pool.replicas) < 1:  # routed, prefilling
            assert time.monotonic() < deadline + 10, "first request not routed"
            time.sleep(0.005)
        holder = next(r for r in pool.replicas if r.outstanding)
        keys = content_keys(head, BLOCK)
        assert aff.exact.match(keys, [holder.index])[holder.index] == 0  # no BlockStored yet
        assert aff.describe(holder)["pending_blocks"] == 25
        _complete(gw, [*head, 2], AUTH_A, "llama-3.1-8b")
        first.result()
    recs = {rec.route["replica"]: rec for rec in recorder.wait(2)  # type: ignore[index]
            if rec.route is not None}
    assert list(recs) == [holder.index]  # both on the holder
    second = [rec for rec in recorder.wait(2) if rec.route and rec.route["pending_tokens"]]
    assert len(second) == 1
    route = second[0].route
    assert route is not None and route["reason"] == "prefix" and route["cache_state"] == "exact"
    assert route["cached_tokens"] == 400 and route["pending_tokens"] > 0
    deadline = time.monotonic() + 10
    while aff.pending.size(holder.index):  # BlockStored confirmed them (or the grace ran out)
        assert time.monotonic() < deadline, "pending blocks never cleared"
        time.sleep(0.02)
    assert aff.exact.match(keys, [holder.index])[holder.index] == 25
