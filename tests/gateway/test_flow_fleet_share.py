"""Fair shares between keys across gateway processes (``flow_control.shared.fair_share``).

End to end: two gateways (each a real uvicorn on loopback, each with its own Redis peer sync)
in front of one simulator, real Redis on 127.0.0.1:6379. Unit: the merged accounting of
:class:`gateway.flow.fleetshare.FleetShares`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import openai

from gateway.flow.fleetshare import FleetShares
from gateway.serving.periodic import Periodic
from tests.gateway.helpers import start_sim
from tests.gateway.test_flow_control import Rig, flow_settings, wait_for

HEAVY, LIGHT = "batch-1", "batch-2"
_EQUAL = {"batch-1": {"class": "batch", "weight": 1}, "batch-2": {"class": "batch", "weight": 1},
          "holder": {"class": "batch"}, "interactive": {"class": "interactive"}}


def _pods(serve_asgi: Callable[..., Any], redis_prefix: str, *, fair_share: bool,
          **flow: Any) -> tuple[Rig, Rig]:
    sim = start_sim(serve_asgi, ttft_s=0.03)  # each request holds the slot ~30 ms
    s = flow_settings(sim.url, saturation={"in_flight": 1}, keys=_EQUAL,
                      shared={"redis_url": "redis://127.0.0.1:6379/0",
                              "key_prefix": redis_prefix, "interval_s": 0.1,
                              "fair_share": fair_share}, **flow)
    return Rig(serve_asgi, sim, s), Rig(serve_asgi, sim, s)


def _heavy_then_light(pod1: Rig, pod2: Rig, heavy_n: int) -> tuple[list[str], str]:
    """Pod 1 holds the one slot; the heavy key queues ``heavy_n`` on pod 1, the light key one
    on pod 2; the slot is freed. Returns the heavy requests' ids in dispatch order and the
    light one's."""
    pod1.hold()
    heavy = [pod1.submit(HEAVY) for _ in range(heavy_n)]
    pod1.wait_queued(heavy_n)
    wait_for(lambda: sum(pod2.pool.replicas[0].peer_in_flight) == 1, "pod 2 sees the slot held")
    light = pod2.submit(LIGHT)
    pod2.wait_queued(1)
    shares = pod1.gate.shares
    if shares is not None:  # pod 1 knows of the light key's waiter before the slot frees
        wait_for(lambda: shares.peer_waiting(("m", 2, LIGHT), pod1.gate.clock()) == 1,
                 "pod 1 sees the light key waiting")
    pod1.release()
    results = [f.result(timeout=60) for f in heavy]
    light_result = light.result(timeout=60)
    assert all(r.http_response.status_code == 200 for r in (*results, light_result))
    ids = {str(r.headers["x-request-id"]) for r in results}
    light_id = str(light_result.headers["x-request-id"])
    order = pod1.dispatch_order()
    return [i for i in order if i in ids], light_id


def test_without_fleet_fair_share_the_heavy_keys_pod_keeps_the_slot(
    serve_asgi: Callable[..., Any], redis_prefix: str,
) -> None:
    """What shared in-flight counts alone give (the design before fair_share): the slot frees on
    pod 1 and pod 1 hands it at once to its own heavy key, every time; the light key on pod 2
    waits for the whole of the heavy key's queue."""
    pod1, pod2 = _pods(serve_asgi, redis_prefix, fair_share=False)
    try:
        heavy, light = _heavy_then_light(pod1, pod2, 6)
        order = pod1.dispatch_order()
        assert order.index(light) > max(order.index(h) for h in heavy)
    finally:
        pod1.close()
        pod2.close()


def test_light_key_on_another_pod_goes_before_the_heavy_keys_next_request(
    serve_asgi: Callable[..., Any], redis_prefix: str,
) -> None:
    """fair_share: the heavy key (6 queued on pod 1) has been served once when the slot frees
    again; the light key on pod 2 has not, so pod 1 leaves the slot to pod 2, which sends the
    light request before the heavy key's second one."""
    pod1, pod2 = _pods(serve_asgi, redis_prefix, fair_share=True)
    try:
        heavy, light = _heavy_then_light(pod1, pod2, 6)
        order = pod1.dispatch_order()
        assert order.index(light) < order.index(heavy[1]), (order, heavy, light)
        assert pod1.gate.shares is not None and pod1.gate.shares.deferred >= 1
    finally:
        pod1.close()
        pod2.close()


def test_a_keys_queue_share_counts_its_waiters_on_every_pod(
    serve_asgi: Callable[..., Any], redis_prefix: str,
) -> None:
    """max_queue_share 0.5 of 4 (2 waiters per key): the heavy key holds 2 on pod 1, so pod 2
    refuses its third with 429 ``flow_queue_full`` while the light key still queues there."""
    pod1, pod2 = _pods(serve_asgi, redis_prefix, fair_share=True, classes=[
        {"name": "interactive", "max_queue": 10}, {"name": "standard", "max_queue": 10},
        {"name": "batch", "max_queue": 4, "max_queue_share": 0.5, "max_wait_s": 30}])
    try:
        pod1.hold()
        heavy = [pod1.submit(HEAVY) for _ in range(2)]
        pod1.wait_queued(2)
        shares = pod2.gate.shares
        assert shares is not None
        wait_for(lambda: shares.peer_waiting(("m", 2, HEAVY), pod2.gate.clock()) == 2,
                 "pod 2 sees the heavy key's waiters")
        refused = pod2.submit(HEAVY).result(timeout=30)
        assert isinstance(refused, openai.RateLimitError) and refused.code == "flow_queue_full"
        light = pod2.submit(LIGHT)
        pod2.wait_queued(1)
        pod1.release()
        assert all(f.result(timeout=60).http_response.status_code == 200
                   for f in (*heavy, light))
    finally:
        pod1.close()
        pod2.close()


# --- the merged accounting (no I/O) -----------------------------------------------------------


def _shares(waiting: list[tuple[str, int, str, int, float]] | None = None) -> FleetShares:
    return FleetShares(half_life_s=10.0, yield_s=0.3, ttl_s=2.0,
                       waiting=lambda: list(waiting or []))


def test_served_is_own_dispatches_plus_the_peers_published_and_decays() -> None:
    s = _shares()
    s.dispatched(("m", 1, "a"), 4.0, now=0.0)
    rows: list[object] = [["m", 1, "a", 2.0, 0, 1.0], ["m", 1, "a", 1.0, 3, 1.0],
                          ["m", 1, "b", 5.0, 1, 2.0], "junk", ["m", "x", "a", 1, 0, 1]]
    s.merge(rows, now=0.0)
    assert s.served(("m", 1, "a"), 0.0) == 7.0
    assert s.peer_waiting(("m", 1, "a"), 0.0) == 3
    # Own cost halves per half-life; the peers' figures are as they published them.
    s.merge(rows, now=10.0)
    assert abs(s.served(("m", 1, "a"), 10.0) - (2.0 + 3.0)) < 1e-9
    # Past ttl_s (Redis failing) only the own figures count.
    assert abs(s.served(("m", 1, "a"), 12.5) - 4.0 * 2 ** -1.25) < 1e-9
    assert s.peer_waiting(("m", 1, "a"), 12.5) == 0
    assert s.claim("m", 1, {"a": 1.0}, 12.5) is None  # b's waiter no longer claims a slot
    assert s.claim("m", 1, {"a": 1.0}, 10.0) == "share"  # while fresh: b 5/2 < a 5/1


def test_rows_publish_recent_dispatches_and_waiters_and_forget_idle_keys() -> None:
    s = _shares([("m", 2, "a", 2, 1.0), ("m", 2, "a", 1, 1.0), ("m", 2, "c", 1, 3.0)])
    s.dispatched(("m", 2, "a"), 1.0, now=0.0)
    s.dispatched(("m", 2, "b"), 1.0, now=0.0)
    assert sorted(s.rows(0.0)) == [("m", 2, "a", 1.0, 3, 1.0), ("m", 2, "b", 1.0, 0, 1.0),
                                   ("m", 2, "c", 0.0, 1, 3.0)]
    rows = s.rows(1000.0)  # b decayed to nothing and does not wait: forgotten
    assert {r[2] for r in rows} == {"a", "c"}


def test_a_less_served_remote_flow_claims_the_slot_and_ties_do_not() -> None:
    s = _shares()
    s.dispatched(("m", 2, "heavy"), 3.0, now=0.0)
    s.merge([["m", 2, "light", 1.0, 1, 1.0]], now=0.0)
    assert s.claim("m", 2, {"heavy": 1.0}, 0.0) == "share"
    assert s.claim("m", 2, {"heavy": 4.0}, 0.0) is None  # weight 4: 3/4 < 1
    assert s.claim("other", 2, {"heavy": 1.0}, 0.0) is None  # another model's waiter
    s.merge([["m", 2, "light", 3.0, 1, 1.0]], now=0.0)
    assert s.claim("m", 2, {"heavy": 1.0}, 0.0) is None  # equal: serve here, no idle slot
    s.merge([["m", 0, "vip", 50.0, 1, 1.0]], now=0.0)
    assert s.claim("m", 2, {"heavy": 1.0}, 0.0) == "priority"
    assert s.claim("m", 0, {"other": 1.0}, 0.0) is None  # same class, more served


def test_a_process_defers_at_most_yield_s_then_serves_its_own() -> None:
    s = _shares()
    s.dispatched(("m", 2, "heavy"), 3.0, now=0.0)
    s.merge([["m", 2, "light", 0.0, 1, 1.0]], now=0.0)
    assert s.defer("m", 2, {"heavy": 1.0}, 0.0)
    assert s.defer("m", 2, {"heavy": 1.0}, 0.3)
    assert not s.defer("m", 2, {"heavy": 1.0}, 0.31)  # not taken in time
    assert s.defer("m", 2, {"heavy": 1.0}, 0.32)  # a new window
    s.merge([], now=0.4)  # the light key was served elsewhere
    assert not s.defer("m", 2, {"heavy": 1.0}, 0.4)
    assert s.deferred == 3


def test_leaving_a_slot_asks_for_one_publication_per_window() -> None:
    s = _shares()
    calls: list[float] = []
    s.on_yield = lambda: calls.append(1.0)
    s.dispatched(("m", 2, "heavy"), 3.0, now=0.0)
    s.merge([["m", 2, "light", 0.0, 1, 1.0]], now=0.0)
    assert s.defer("m", 2, {"heavy": 1.0}, 0.0) and s.defer("m", 2, {"heavy": 1.0}, 0.1)
    assert len(calls) == 1
    assert not s.defer("m", 2, {"heavy": 1.0}, 0.5) and s.defer("m", 2, {"heavy": 1.0}, 0.6)
    assert len(calls) == 2


def test_a_woken_periodic_round_runs_before_its_interval() -> None:
    """Periodic.wake: with interval_s 60 the second round runs at once when woken."""

    class Rounds(Periodic):
        interval_s = 60.0

        def __init__(self) -> None:
            self.times: list[float] = []
            self.ran = asyncio.Event()

        async def run_once(self) -> None:
            self.times.append(time.monotonic())
            self.ran.set()

    async def run() -> list[float]:
        rounds = Rounds()
        rounds.wake()  # not started: nothing
        rounds.start()
        await asyncio.wait_for(rounds.ran.wait(), 10)
        rounds.ran.clear()
        rounds.wake()
        await asyncio.wait_for(rounds.ran.wait(), 10)  # far below interval_s
        await rounds.stop()
        return rounds.times

    times = asyncio.run(run())
    assert len(times) == 2 and times[1] - times[0] < 10
