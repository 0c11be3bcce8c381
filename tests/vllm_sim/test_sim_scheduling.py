"""vLLM's scheduler options in the engine model: ``--long-prefill-token-threshold`` and
``--scheduling-policy priority`` (order of the waiting queue, the body's ``priority``)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from vllm_sim.engine import Engine, SeqHandle
from vllm_sim.kv_cache import block_hashes
from vllm_sim.profiles import PROFILES
from vllm_sim.waiting import SchedulingPolicy, WaitingQueue


def _seq(tag: str, prompt: int, output: int = 2, priority: int = 0) -> SeqHandle:
    hashes = block_hashes([f"{tag}{i}" for i in range(prompt)], 16)
    return SeqHandle(prompt_hashes=hashes, prompt_tokens=prompt, output_tokens=output,
                     final_hashes=hashes, priority=priority)


def _engine(**update: Any) -> Engine:
    return Engine(PROFILES["tiny-test"].model_copy(update=update))


def _queue(engine: Engine, *seqs: SeqHandle) -> None:
    """Queue ``seqs`` in this order without starting the step loop (the tests drive it)."""
    for n, seq in enumerate(seqs):
        seq.arrival = n
        engine.waiting.add(seq)


def _plan(engine: Engine) -> tuple[dict[str, int], list[str], list[str]]:
    """Plan and complete one step: ``({tag: chunk tokens}, [decoding], [preempted])``."""
    plan = engine.schedule()
    engine.complete(plan)
    tag = _tag
    return ({tag(s): n for s, n in plan.chunks}, [tag(s) for s in plan.decoding],
            [tag(s) for s in plan.preempted])


def _tag(seq: SeqHandle) -> str:
    return str(seq.prompt_ids[0]) if seq.prompt_ids else "?"


def _named(tag: str, prompt: int, output: int = 2, priority: int = 0) -> SeqHandle:
    seq = _seq(tag, prompt, output, priority)
    seq.prompt_ids = [tag]  # type: ignore[list-item]  # only read back by _tag
    return seq


def test_without_a_threshold_a_long_prefill_takes_the_whole_budget() -> None:
    engine = _engine(max_num_batched_tokens=64)
    _queue(engine, _named("long", 100), _named("short", 10))
    # The long prompt's first 64 tokens spend the budget: the short one is not admitted.
    assert _plan(engine) == ({"long": 64}, [], [])
    assert _plan(engine) == ({"long": 36, "short": 10}, [], [])


def test_the_threshold_caps_each_prefill_chunk_and_leaves_budget_to_the_others() -> None:
    engine = _engine(max_num_batched_tokens=64, long_prefill_token_threshold=16)
    _queue(engine, _named("long", 100), _named("short", 10), _named("third", 50))
    # Waiting and running alike advance at most 16 tokens per step (vLLM caps both).
    assert _plan(engine) == ({"long": 16, "short": 10, "third": 16}, [], [])
    assert _plan(engine) == ({"long": 16, "third": 16}, ["short"], [])
    steps = 2
    while _plan(engine)[0].get("long") is not None:
        steps += 1
    assert steps == 7  # ceil(100 / 16) chunks before its first token


def test_a_threshold_above_the_prompt_changes_nothing() -> None:
    engine = _engine(max_num_batched_tokens=64, long_prefill_token_threshold=128)
    _queue(engine, _named("long", 100), _named("short", 10))
    assert _plan(engine) == ({"long": 64}, [], [])


@pytest.mark.parametrize(("policy", "victim"), [("fcfs", "b"), ("priority", "a")])
def test_a_running_request_without_a_free_block_preempts_as_the_policy_says(
    policy: SchedulingPolicy, victim: str,
) -> None:
    """Four blocks of 16 tokens; ``a`` (priority 5, first) holds 2 after its first token,
    ``b`` (priority 0) 2 as well and needs a third at its 13th token. FCFS preempts the last
    running request (``b`` itself); priority the lowest priority (``a``, already planned in
    that step: its token goes back to the budget)."""
    engine = _engine(num_gpu_blocks=4, scheduling_policy=policy)
    a, b = _named("a", 16, output=40, priority=5), _named("b", 20, output=40)
    _queue(engine, a)
    assert _plan(engine) == ({"a": 16}, [], [])
    b.arrival = 1
    engine.waiting.add(b)
    assert _plan(engine) == ({"b": 20}, ["a"], [])
    while not (step := _plan(engine))[2]:
        assert step[1] == ["a", "b"]
    # Feeding its 13th token needs a 3rd block (20 + 13 > 32); with a's blocks b decodes it.
    assert b.generated == (13 if victim == "b" else 14)
    chunks, decoding, preempted = step
    assert (chunks, preempted) == ({}, [victim])
    # FCFS: a decodes, b gave itself up. Priority: a's planned token was withdrawn.
    assert decoding == (["a"] if victim == "b" else ["b"])
    gone = a if victim == "a" else b
    assert (gone.computed, gone.held, gone.anon, gone.preemptions) == (0, [], 0, 1)
    assert gone.target == gone.prompt_tokens + gone.generated  # recomputes prompt and output
    assert list(engine.waiting) == [gone] and engine.preemptions_total == 1
    # No waiting request is admitted in a step that preempted; the victim comes back later
    # and recomputes prompt and output before its next token.
    for _ in range(200):
        _plan(engine)
        if gone.computed >= gone.target:
            break
    assert gone.generated == gone.target - gone.prompt_tokens + 1


def _admission_order(policy: SchedulingPolicy) -> list[str]:
    """Names in the order they got their first token: one sequence slot, ``busy`` holds it
    while ``low`` (priority 5), ``high`` (-1) and ``mid`` (0) arrive, in that order."""

    async def run() -> list[str]:
        engine = _engine(max_num_seqs=1, scheduling_policy=policy)
        busy = _seq("b", 8, output=20)
        engine.submit(busy)
        await asyncio.wait_for(busy.wait_tokens(1), 5)
        seqs = {"low": _seq("x", 8, priority=5 if policy == "priority" else 0),
                "high": _seq("y", 8, priority=-1 if policy == "priority" else 0),
                "mid": _seq("z", 8)}
        for seq in seqs.values():
            engine.submit(seq)
        order: list[str] = []

        async def first(name: str) -> None:
            await seqs[name].wait_tokens(1)
            order.append(name)

        await asyncio.wait_for(asyncio.gather(*(first(n) for n in seqs)), 5)
        await engine.close()
        return order

    return asyncio.run(run())


def test_fcfs_admits_waiting_requests_in_arrival_order() -> None:
    assert _admission_order("fcfs") == ["low", "high", "mid"]


def test_priority_admits_the_lowest_value_first_then_by_arrival() -> None:
    assert _admission_order("priority") == ["high", "mid", "low"]


def test_priority_queue_puts_a_preempted_request_at_its_place_fcfs_at_the_front() -> None:
    a, b, c = _seq("a", 4, priority=1), _seq("b", 4, priority=0), _seq("c", 4, priority=1)
    for i, s in enumerate((a, b, c)):
        s.arrival = i
    prio = WaitingQueue("priority")
    fifo = WaitingQueue("fcfs")
    for q in (prio, fifo):
        q.add(b)
        q.add(c)
        q.prepend(a)
    assert [s.arrival for s in prio] == [1, 0, 2]  # (0, 1) < (1, 0) < (1, 2)
    assert [s.arrival for s in fifo] == [0, 1, 2]
    prio.remove(c)
    assert (len(prio), prio.pop() is b, prio.peek() is a, c in prio) == (2, True, True, False)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_priority_is_refused_unless_the_engine_runs_priority_scheduling(
    start_sim: Any, path: str,
) -> None:
    body: dict[str, Any] = {"model": "sim-model", "max_tokens": 2, "priority": 3}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    fcfs = start_sim(profile="tiny-test")
    refused = httpx.post(f"{fcfs.url}{path}", json=body)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        "Got priority 3 but Priority scheduling is not enabled.")
    assert httpx.post(f"{fcfs.url}{path}", json={**body, "priority": 0}).status_code == 200
    assert httpx.post(f"{fcfs.url}{path}", json={**body, "priority": "1"}).status_code == 400
    prio = start_sim(profile="tiny-test", scheduling_policy="priority")
    assert httpx.post(f"{prio.url}{path}", json=body).status_code == 200
    assert "vllm:num_preemptions_total" in httpx.get(f"{prio.url}/metrics").text
    assert httpx.post(f"{prio.url}{path}", json={**body, "priority": -7}).status_code == 200
    # Without a profile the policy is the config's: vLLM checks the field all the same.
    plain = start_sim()
    assert httpx.post(f"{plain.url}{path}", json=body).status_code == 400
    assert httpx.post(f"{start_sim(scheduling_policy='priority').url}{path}",
                      json=body).status_code == 200
