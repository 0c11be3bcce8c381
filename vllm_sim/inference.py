"""Answering inference requests: generation pacing, embeddings and client-disconnect handling.

``generate`` and ``embed`` produce the response of one validated request (time to first token,
inter-token latency, fault-aware writes); ``until_disconnect`` runs such a coroutine and
cancels it when the client goes away (ASGI ``http.disconnect``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any

from vllm_sim.config import FaultSpec, SimConfig
from vllm_sim.engine import Engine, SeqHandle
from vllm_sim.protocol import Generation, prompt_length
from vllm_sim.render import (
    chat_response,
    chat_stream,
    completion_response,
    completion_stream,
    dumps,
    embedding_response,
    new_id,
    total_completion_tokens,
)
from vllm_sim.state import SimState
from vllm_sim.wire import Receive, Send, SseWriter, send_body, wait_disconnect


class EnginePacer:
    """Paces a response by the engine model: the first token, then one token per step.

    Args:
        engine: The app's engine.
        seq: The request's sequence (submitted by :meth:`first`, removed by :meth:`close`).
    """

    def __init__(self, engine: Engine, seq: SeqHandle) -> None:
        self.engine = engine
        self.seq = seq
        self._next = 1

    async def first(self) -> None:
        """Queue the sequence and wait for its first token (the time to first token)."""
        self.engine.submit(self.seq)
        await self.seq.wait_tokens(1)

    async def next(self) -> None:
        """Wait for the next token."""
        self._next += 1
        await self.seq.wait_tokens(self._next)

    async def rest(self) -> None:
        """Wait until every token is generated (non-streamed answers)."""
        await self.seq.wait_tokens(self.seq.output_tokens)

    def close(self) -> None:
        """Take the sequence out of the engine (also when the client went away)."""
        self.engine.abort(self.seq)


async def generate(
    config: SimConfig,
    state: SimState,
    gen: Generation,
    prompts: list[str | list[int]] | None,
    echo: bool,
    send: Send,
    fault: FaultSpec | None,
    pacer: EnginePacer | None = None,
) -> None:
    """Answer a chat or completions request (``prompts`` None = chat); updates the metrics.

    With a ``pacer`` (a profile is configured) the engine model paces the tokens instead of
    ``ttft_s``/``itl_s``.
    """
    if pacer is None:
        await _generate(config, state, gen, prompts, echo, send, fault, None)
        return
    try:
        await _generate(config, state, gen, prompts, echo, send, fault, pacer)
    finally:
        pacer.close()


async def _generate(
    config: SimConfig,
    state: SimState,
    gen: Generation,
    prompts: list[str | list[int]] | None,
    echo: bool,
    send: Send,
    fault: FaultSpec | None,
    pacer: EnginePacer | None,
) -> None:
    cfg = config
    created = int(time.time())
    if pacer is not None:
        await pacer.first()
    elif cfg.ttft_s:
        await asyncio.sleep(cfg.ttft_s)
    if prompts is None:
        rid = new_id("chatcmpl")
    else:
        rid = new_id("cmpl")
    if gen.stream:
        writer = SseWriter(send, fault)
        await writer.start()
        if prompts is None:
            events = chat_stream(gen, rid, created)
            undelayed = 2 * gen.n  # role events and the first token of each choice
        else:
            events = completion_stream(gen, prompts, rid, created)
            undelayed = gen.n
        itl = cfg.itl_s
        # the usage event follows the last token at once (vLLM sends it in the same step)
        delayed_until = 1 << 62
        if gen.include_usage:
            delayed_until = count_events(gen, prompts) - 1
        for k, payload in enumerate(events):
            if undelayed <= k < delayed_until:
                if pacer is not None:
                    await pacer.next()
                elif itl:
                    await asyncio.sleep(itl)
            await writer.event(payload)
        await writer.finish()
    else:
        if prompts is None:
            doc = chat_response(gen, rid, created)
        else:
            doc = completion_response(gen, prompts, rid, created, echo)
        tokens = total_completion_tokens(gen, len(prompts or [None]))
        if pacer is not None:
            await pacer.rest()
        elif cfg.itl_s:
            await asyncio.sleep(cfg.itl_s * max(tokens - 1, 0))
        await send_body(send, 200, dumps(doc).encode(), fault=fault)
    state.prompt_tokens_total[gen.model] += gen.prompt_tokens
    state.generation_tokens_total[gen.model] += total_completion_tokens(
        gen, len(prompts or [None])
    )
    reason = "stop" if gen.finish_reason == "tool_calls" else gen.finish_reason
    state.success_total[(gen.model, reason)] += gen.n


async def embed(
    config: SimConfig,
    state: SimState,
    model: str,
    inputs: list[str | list[int]],
    base64_format: bool,
    send: Send,
    fault: FaultSpec | None,
) -> None:
    """Answer an embeddings request; updates the prompt-token counter."""
    if config.ttft_s:
        await asyncio.sleep(config.ttft_s)
    tokens = sum(prompt_length(i) for i in inputs)
    doc = embedding_response(
        model, inputs, config.embedding_dim, base64_format, tokens, int(time.time())
    )
    state.prompt_tokens_total[model] += tokens
    await send_body(send, 200, dumps(doc).encode(), fault=fault)


async def until_disconnect(receive: Receive, work: Coroutine[Any, Any, None]) -> bool:
    """Run ``work`` until it finishes (True) or the client disconnects (False, work cancelled).

    Raises:
        SimulatedCrash: re-raised from ``work`` so that uvicorn drops the connection.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task.done():
        watcher.cancel()
        task.result()
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False


def count_events(gen: Generation, prompts: list[str | list[int]] | None) -> int:
    """Number of JSON events of a stream (without ``[DONE]``)."""
    usage = 1 if gen.include_usage else 0
    if prompts is not None:
        return gen.completion_tokens * gen.n * len(prompts) + usage
    if gen.tool is not None:
        return (total_completion_tokens(gen) // gen.n + 1) * gen.n + usage
    return (1 + gen.completion_tokens) * gen.n + usage


async def hang() -> None:
    """Never answer (fault ``hang``); ends only by cancellation when the client goes."""
    await asyncio.Event().wait()
