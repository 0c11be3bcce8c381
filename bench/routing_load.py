"""Workloads and the open-loop client of ``bench/routing.py``.

Prompt lengths are in simulator tokens (one word = one token, see ``vllm_sim.tokens``); against
a real vLLM the same words are a few more tokens each.

* ``shared-prefix``: G groups x P prompts; every prompt of a group starts with the group's
  S-token system prompt, then a Q-token question of its own; O output tokens.
* ``multi-turn``: U users x R rounds; every user shares one S-token system prompt, each round adds
  a Q-token question and the history carries the previous answers. A round is sent at its
  arrival time or, if the previous round's answer is not back yet, as soon as it is.
* ``random``: N prompts of S + Q tokens sharing nothing.

Arrivals are open-loop: Poisson with the given rate (exponential gaps), fixed by the seed, so
every strategy sees the same schedule.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from vllm_sim.prompt import chat_text, prompt_pieces
from vllm_sim.tokens import piece_ids


@dataclass
class Turn:
    """One request of a workload.

    Attributes:
        at_s: Arrival time from the start of the run, seconds.
        messages: Chat messages; for multi-turn the history is filled in when it is sent.
        user: Conversation id (multi-turn), else ``None``.
        after: Index of the turn whose answer this one's history needs, or ``None``.
    """

    at_s: float
    messages: list[dict[str, str]]
    user: str | None = None
    after: int | None = None


@dataclass
class Result:
    """What the client measured for one request (seconds; ``ok`` False on any failure)."""

    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    output_tokens: int = 0
    answer: str = ""
    backend: str | None = None


@dataclass
class WorkloadSpec:
    """Parameters of the three workloads (see the module docstring)."""

    groups: int = 16
    prompts_per_group: int = 8
    system_tokens: int = 2000
    question_tokens: int = 100
    output_tokens: int = 24
    users: int = 16
    rounds: int = 6
    turn_tokens: int = 300
    user_system_tokens: int = 500
    random_requests: int = 96
    extra: dict[str, Any] = field(default_factory=dict)


def _words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def _arrivals(n: int, rate: float, rng: random.Random) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def build(workload: str, spec: WorkloadSpec, rate: float, seed: int) -> list[Turn]:
    """The turns of ``workload`` at ``rate`` requests per second (deterministic per seed).

    Raises:
        ValueError: Unknown workload name.
    """
    rng = random.Random(seed)  # noqa: S311 - a reproducible schedule, not a secret
    if workload == "shared-prefix":
        pairs = [(g, p) for g in range(spec.groups) for p in range(spec.prompts_per_group)]
        rng.shuffle(pairs)
        times = _arrivals(len(pairs), rate, rng)
        return [
            Turn(t, [{"role": "system", "content": _words(spec.system_tokens, f"g{g}s")},
                     {"role": "user", "content": _words(spec.question_tokens, f"g{g}p{p}q")}])
            for t, (g, p) in zip(times, pairs, strict=True)
        ]
    if workload == "multi-turn":
        n = spec.users * spec.rounds
        times = _arrivals(n, rate, rng)
        turns: list[Turn] = []
        system = _words(spec.user_system_tokens, "sys")
        last: dict[int, int] = {}
        # Users take their turns in a new random order every round, so that no strategy is
        # favoured by a fixed arrival order (round robin would pin user u to replica u mod n).
        order = [u for _ in range(spec.rounds) for u in rng.sample(range(spec.users), spec.users)]
        for i, (t, u) in enumerate(zip(times, order, strict=True)):
            r = i // spec.users
            question = {"role": "user", "content": _words(spec.turn_tokens, f"u{u}r{r}q")}
            msgs = [{"role": "system", "content": system}, question]
            turns.append(Turn(t, msgs, user=f"user-{u}", after=last.get(u)))
            last[u] = i
        return turns
    if workload == "random":
        times = _arrivals(spec.random_requests, rate, rng)
        return [
            Turn(t, [{"role": "user", "content": _words(
                spec.system_tokens + spec.question_tokens, f"r{i}x{rng.randrange(10**9)}w")}])
            for i, t in enumerate(times)
        ]
    raise ValueError(f"unknown workload {workload!r} (shared-prefix, multi-turn, random)")


class Target:
    """Chooses the base URL for one request body: a router's URL (this class), or a replica."""

    def __init__(self, url: str = "") -> None:
        self.url = url

    async def pick(self, body: dict[str, Any]) -> str:
        """The base URL to send ``body`` to."""
        return self.url

    def done(self, url: str) -> None:
        """The request sent to ``url`` has ended."""


async def run(
    client: httpx.AsyncClient,
    turns: list[Turn],
    target: Target,
    model: str,
    output_tokens: int,
    headers: dict[str, str],
    prompt_format: str = "chat",
) -> tuple[list[Result], float]:
    """Send every turn at its arrival time (open loop); return the results and the wall time.

    Multi-turn history: a turn with ``after`` waits for that turn's answer and then sends the
    previous turn's messages, the answer, and its own new question.

    ``prompt_format="tokens"`` sends each chat as a completions request whose ``prompt`` is
    the token ids the simulator's engine computes for that chat (its chat rendering and piece
    ids): the same cache behaviour, and prompt token ids a router can match against the
    replicas' KV-cache events.
    """
    done: list[asyncio.Event] = [asyncio.Event() for _ in turns]
    results: list[Result] = [Result(ok=False) for _ in turns]
    sent: list[list[dict[str, str]]] = [[] for _ in turns]
    t0 = time.monotonic()

    async def one(i: int, turn: Turn) -> None:
        await asyncio.sleep(max(0.0, t0 + turn.at_s - time.monotonic()))
        messages = turn.messages
        if turn.after is not None:
            await done[turn.after].wait()
            prev = sent[turn.after]
            messages = [*prev, {"role": "assistant", "content": results[turn.after].answer},
                        turn.messages[-1]]
        sent[i] = messages
        body: dict[str, Any] = {
            "model": model, "messages": messages, "max_tokens": output_tokens,
            "stream": True, "stream_options": {"include_usage": True},
        }
        if prompt_format == "tokens":
            body["prompt"] = piece_ids(prompt_pieces(chat_text({"messages": messages})))
            del body["messages"]
        if turn.user is not None:
            body["user"] = turn.user
        url = await target.pick(body)
        try:
            results[i] = await _stream(client, url, body, headers)
        finally:
            target.done(url)
            done[i].set()

    await asyncio.gather(*(one(i, t) for i, t in enumerate(turns)))
    return results, time.monotonic() - t0


async def _stream(
    client: httpx.AsyncClient, base: str, body: dict[str, Any], headers: dict[str, str]
) -> Result:
    start = time.monotonic()
    ttft = 0.0
    parts: list[str] = []
    tokens = 0
    try:
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        async with client.stream("POST", f"{base}{path}", json=body,
                                 headers=headers) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return Result(ok=False)
            backend = resp.headers.get("x-backend")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                for choice in event.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") or choice.get("text")
                    if text:
                        if not ttft:
                            ttft = time.monotonic() - start
                        parts.append(text)
                if event.get("usage"):
                    tokens = int(event["usage"].get("completion_tokens") or 0)
    except httpx.HTTPError:
        return Result(ok=False)
    return Result(ok=bool(ttft), ttft_s=ttft, e2e_s=time.monotonic() - start,
                  output_tokens=tokens or len(parts), answer="".join(parts), backend=backend)
