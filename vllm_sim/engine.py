"""The simulator's engine model: continuous batching over a paged KV cache with prefix caching.

Opt-in per app (``SimConfig.profile``). One :class:`Engine` per app runs a step loop on the
event loop, like vLLM V1's scheduler, over the KV cache of :mod:`vllm_sim.kv_cache`:

* **Steps** (vLLM V1's ``Scheduler.schedule()``, ``vllm/v1/core/sched/scheduler.py``): each
  step has a budget of ``max_num_batched_tokens`` tokens. The running sequences are served
  first, in order: one token for a decoding sequence, the rest of its prompt (up to the budget)
  for one still prefilling, at most ``long_prefill_token_threshold`` tokens of it per step when
  that is set (vLLM's ``--long-prefill-token-threshold``). KV blocks are allocated as tokens
  are scheduled (vLLM's ``allocate_slots``); a running sequence that cannot get its next block
  preempts one (the last under FCFS, the lowest priority under ``priority``), which frees its
  blocks and is queued again to recompute. Then, unless a sequence was preempted, waiting
  sequences in the order of ``scheduling_policy`` (:mod:`vllm_sim.waiting`: FCFS, or lowest
  ``priority`` value then arrival as vLLM's ``--scheduling-policy priority``), while budget
  and ``max_num_seqs`` slots remain: each is admitted when the KV cache can hold its first
  chunk and takes a prefill chunk of the remaining budget. A sequence that does not fit
  blocks the ones behind it, as in vLLM. A step lasts ``PerfProfile.step_time_s(...) *
  time_scale`` seconds; a sequence whose prefill completes emits its first token at the end of
  that step, decoding sequences one token per step.
* **Automatic prefix caching**, the scheduler's side (the blocks, their hashes and their
  eviction are :class:`vllm_sim.kv_cache.BlockCache`): at admission the longest cached prefix
  is reused, in whole blocks of at most ``prompt - 1`` tokens (the last token is always
  computed; vLLM V1's ``KVCacheManager.get_computed_blocks``); its blocks are referenced, the
  rest allocated. The full blocks a prefill chunk computes are hashed when the chunk is
  *scheduled* (``KVCacheManager.allocate_slots`` caches up to ``num_computed_tokens +
  num_new_tokens``), so a request scheduled after it, even in the same step, reuses them. When
  a request ends its full blocks stay cached; the blocks of the answer are cached under the
  hashes of the conversation as the next turn's prompt will render it.

KV-cache events (vLLM's ``--kv-events-config``, :mod:`vllm_sim.kv_events`): the cache records
them (:mod:`vllm_sim.kv_cache`) and the engine publishes the step's events as one batch after
each step, as vLLM's scheduler does.

Metrics (vLLM's names): ``num_requests_waiting``/``running``, ``kv_cache_usage_perc`` (blocks
referenced by running requests / all blocks), ``prefix_cache_queries``/``hits`` (prompt tokens
looked up / found cached, counted at admission like vLLM V1).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vllm_sim.kv_cache import BlockCache
from vllm_sim.kv_events import SimEvent
from vllm_sim.profiles import PerfProfile
from vllm_sim.waiting import WaitingQueue

__all__ = ["Engine", "SeqHandle", "StepPlan"]


@dataclass(eq=False)
class SeqHandle:
    """One request inside the engine; the responder awaits its tokens.

    Attributes:
        prompt_hashes: Chained hashes of the prompt's full blocks.
        prompt_ids: Token ids of the prompt (with the answer: ``final_ids``), for the events.
        prompt_tokens: Prompt length in tokens.
        output_tokens: Tokens to generate.
        final_hashes: Hashes of the full blocks of prompt plus answer (cached when it ends).
        priority: The body's ``priority`` (vLLM: lower is scheduled first; ``priority``
            policy only).
        arrival: Order of submission to the engine (set by :meth:`Engine.submit`).
        cached_tokens: Prompt tokens found in the prefix cache at admission.
        computed: Tokens of ``target`` computed or reused so far.
        generated: Tokens generated so far.
        target: Tokens to prefill before the next token is sampled: the prompt, or after a
            preemption the prompt and the tokens generated before it (vLLM recomputes both).
        preemptions: Times the engine preempted it.
    """

    prompt_hashes: list[int]
    prompt_tokens: int
    output_tokens: int
    final_hashes: list[int]
    priority: int = 0
    arrival: int = 0
    cached_tokens: int = 0
    computed: int = 0
    generated: int = 0
    held: list[int] = field(default_factory=list)
    anon: int = 0
    prompt_ids: list[int] = field(default_factory=list)
    final_ids: list[int] = field(default_factory=list)
    done: bool = False
    target: int = -1
    preemptions: int = 0
    _event: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        if self.target < 0:
            self.target = self.prompt_tokens

    async def wait_tokens(self, n: int) -> None:
        """Return once ``n`` tokens are generated (or the sequence is finished)."""
        while self.generated < n and not self.done:
            self._event.clear()
            await self._event.wait()

    def _wake(self) -> None:
        self._event.set()


@dataclass
class StepPlan:
    """One engine step as :meth:`Engine.schedule` planned it.

    Attributes:
        chunks: Prefill chunks ``(sequence, tokens)``.
        decoding: Sequences generating one token.
        ctx: Context tokens (prompt plus output so far) of the decoding sequences.
        preempted: Sequences preempted while planning (back in the waiting queue).
    """

    chunks: list[tuple[SeqHandle, int]]
    decoding: list[SeqHandle]
    ctx: int
    preempted: list[SeqHandle]


class Engine:
    """The step loop of one simulated replica (see the module docstring).

    Args:
        profile: The performance numbers.
        time_scale: Wall-clock seconds per model second (2.0 runs everything half as fast).
    """

    def __init__(self, profile: PerfProfile, time_scale: float = 1.0) -> None:
        self.profile = profile
        self.time_scale = time_scale
        self.cache = BlockCache(profile.num_gpu_blocks)
        self.waiting: WaitingQueue[SeqHandle] = WaitingQueue(profile.scheduling_policy)
        self._arrivals = 0
        self.running: list[SeqHandle] = []
        self.queries_total = 0
        self.hits_total = 0
        self.steps = 0
        self.preemptions_total = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.publish: Callable[[Sequence[SimEvent]], None] | None = None

    @property
    def kv_usage(self) -> float:
        """Fraction of blocks referenced by running requests (``vllm:kv_cache_usage_perc``)."""
        return self.cache.used / self.cache.num_blocks

    def submit(self, seq: SeqHandle) -> None:
        """Queue ``seq``; starts the step loop on first use."""
        seq.arrival = self._arrivals
        self._arrivals += 1
        self.waiting.add(seq)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())
        self._wake.set()

    def abort(self, seq: SeqHandle) -> None:
        """Remove ``seq`` (finished, or its client went away) and free its blocks."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
            self._finish_blocks(seq)
        seq.done = True
        seq._wake()
        self.flush_events()

    def flush_events(self) -> None:
        """Publish the cache's events since the last flush as one batch (if any)."""
        events = self.cache.events
        if events:
            self.cache.events = []
            if self.publish is not None:
                self.publish(events)

    def cached_tokens(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """Prompt tokens a request with these block hashes would find cached now."""
        size = self.profile.block_size
        cap = max(prompt_tokens - 1, 0) // size
        return min(self.cache.cached_prefix(hashes), cap) * size

    def reset_cache(self) -> None:
        """Drop unreferenced cached blocks and zero the prefix-cache counters."""
        self.cache.reset()
        self.flush_events()
        self.queries_total = 0
        self.hits_total = 0

    async def close(self) -> None:
        """Stop the step loop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- the loop --------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Plan one step as vLLM V1's ``Scheduler.schedule()`` does (the step loop's first half).

        Running sequences first, in order: each takes what it still needs (one token when
        decoding, the rest of its prompt when prefilling, capped by
        ``long_prefill_token_threshold``) up to the step's token budget, and the KV blocks
        that many more tokens need. When the blocks cannot be had, a running sequence is
        *preempted* (its blocks freed, its computed tokens forgotten, back to the waiting
        queue to be recomputed) until they can: the last one under ``fcfs``, the one with the
        highest ``(priority, arrival)`` under ``priority`` (possibly one already planned in
        this step: its tokens go back to the budget), and when the victim is the sequence
        itself nothing more is planned. Then, unless a sequence was preempted, waiting
        sequences in the policy's order while budget and sequence slots remain: each looks up
        its cached prefix *now*, is admitted if the blocks of its first chunk fit (else it
        and those behind it wait: a waiting sequence never preempts), and takes a chunk of at
        most the remaining budget. As in vLLM V1 (``KVCacheManager.allocate_slots`` caching up
        to ``num_computed_tokens + num_new_tokens``), the full blocks a chunk will compute are
        hashed when it is scheduled, so a sequence scheduled later (in this step or the next)
        already reuses them.

        Returns:
            The plan; :meth:`complete` applies it once the step's time has passed.
        """
        budget = self.profile.max_num_batched_tokens
        planned: dict[SeqHandle, int] = {}  # tokens per sequence, in scheduling order
        preempted: list[SeqHandle] = []
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            todo = seq.target - seq.computed
            take = min(self._chunk(todo) if todo > 0 else 1, budget)
            # KV tokens after this step: the chunk's end, or the context with the token fed.
            tokens = seq.computed + take if todo > 0 else seq.prompt_tokens + seq.generated
            while not self._grow(seq, tokens):
                victim = (max(self.running, key=lambda r: (r.priority, r.arrival))
                          if self.waiting.policy == "priority" else self.running[-1])
                if victim in planned:  # planned before ``seq`` in this step
                    budget += planned.pop(victim)
                    i -= 1
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq in preempted:
                break
            planned[seq] = take
            if todo > 0:
                self._cache_scheduled(seq, seq.computed + take)
            budget -= take
            i += 1
        while (not preempted and budget > 0 and self.waiting
               and len(self.running) < self.profile.max_num_seqs):
            seq = self.waiting.peek()
            take = self._admit(seq, budget)
            if not take:
                break  # head of line waits for blocks, as in vLLM
            self.waiting.pop()
            self.running.append(seq)
            planned[seq] = take
            self._cache_scheduled(seq, seq.computed + take)
            budget -= take
        chunks = [(q, n) for q, n in planned.items() if q.computed < q.target]
        decoding = [q for q in planned if q.computed >= q.target]
        ctx = sum(q.prompt_tokens + q.generated for q in decoding)
        return StepPlan(chunks, decoding, ctx, preempted)

    def complete(self, plan: StepPlan) -> None:
        """Apply a planned step (the step loop's second half): decoding sequences get a
        token, chunks advance their prefill (the step that ends one samples a token),
        finished sequences leave and free their blocks; the step's KV events are published."""
        self.steps += 1
        for seq in plan.decoding:
            if seq.done:
                continue
            seq.generated += 1
            seq._wake()
        for seq, n in plan.chunks:
            if seq.done:
                continue
            seq.computed += n
            if seq.computed >= seq.target:
                seq.generated += 1  # the step that ends a prefill samples a token
                seq._wake()
        for seq in [s for s in self.running if s.generated >= s.output_tokens]:
            self.running.remove(seq)
            self._finish_blocks(seq)
            seq.done = True
            seq._wake()
        self.flush_events()

    def _chunk(self, todo: int) -> int:
        """``todo`` tokens to prefill capped by ``long_prefill_token_threshold`` (0: no cap).

        vLLM V1 applies the cap to every request still prefilling, running or waiting, before
        the step's remaining budget: a long prompt advances at most that many tokens per step,
        which leaves the rest of the budget (and a shorter step) to the others.
        """
        threshold = self.profile.long_prefill_token_threshold
        return threshold if 0 < threshold < todo else todo

    def _admit(self, seq: SeqHandle, budget: int) -> int:
        """Reference ``seq``'s cached prefix and allocate the blocks of its first chunk.

        The hit is whole blocks of at most ``prompt - 1`` tokens (vLLM V1's
        ``get_computed_blocks``: the last prompt token is always computed, and computed
        tokens are block-aligned). Counted in the prefix-cache counters at admission. A
        preempted sequence is admitted the same way: it recomputes its prompt and the tokens
        it had generated (``target``).

        Returns:
            The chunk's tokens, or 0 (nothing changed) when its blocks do not fit.
        """
        size = self.profile.block_size
        cap = max(seq.prompt_tokens - 1, 0) // size
        hit_blocks = min(self.cache.cached_prefix(seq.prompt_hashes), cap)
        take = min(self._chunk(seq.target - hit_blocks * size), budget)
        new = -(-(hit_blocks * size + take) // size) - hit_blocks
        hit = seq.prompt_hashes[:hit_blocks]
        if not self.cache.acquire(hit, new):
            return 0
        seq.held = list(hit)
        seq.anon = new
        seq.cached_tokens = seq.computed = hit_blocks * size
        self.queries_total += seq.prompt_tokens
        self.hits_total += seq.cached_tokens
        return take

    def _grow(self, seq: SeqHandle, tokens: int) -> bool:
        """Allocate the blocks ``seq`` needs to hold ``tokens`` tokens of KV (False: no room)."""
        need = -(-tokens // self.profile.block_size) - len(seq.held) - seq.anon
        if need <= 0:
            return True
        if not self.cache.acquire([], need):
            return False
        seq.anon += need
        return True

    def _preempt(self, seq: SeqHandle) -> None:
        """vLLM's ``_preempt_request``: free the blocks (hashed ones stay cached), forget the
        computed tokens, queue it again (fcfs: at the front) to recompute prompt and output."""
        self.running.remove(seq)
        self.cache.release(seq.held, seq.anon)
        seq.held, seq.anon = [], 0
        seq.computed = 0
        seq.target = seq.prompt_tokens + seq.generated
        seq.preemptions += 1
        self.preemptions_total += 1
        self.waiting.prepend(seq)

    def _cache_scheduled(self, seq: SeqHandle, upto_tokens: int) -> None:
        """Hash the prompt's full blocks up to ``upto_tokens`` (scheduled for this step)."""
        full = min(upto_tokens // self.profile.block_size, len(seq.prompt_hashes))
        if full > len(seq.held):
            self._promote(seq, seq.prompt_hashes[:full], seq.prompt_ids)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                next_at = loop.time()
                continue
            plan = self.schedule()
            if not plan.chunks and not plan.decoding and not plan.preempted:
                # Nothing fits (KV cache full of waiting heads): wait for a change.
                self._wake.clear()
                await self._wake.wait()
                next_at = loop.time()
                continue
            prefill = sum(n for _, n in plan.chunks)
            step = self.profile.step_time_s(prefill, len(plan.decoding), plan.ctx)
            # Deadline-based pacing: a late wake-up shortens the next sleep (no drift).
            next_at = max(next_at + step * self.time_scale, loop.time())
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            self.complete(plan)

    def _promote(self, seq: SeqHandle, hashes: Sequence[int], ids: Sequence[int]) -> None:
        start = len(seq.held)
        new = hashes[start : start + seq.anon]
        size = self.profile.block_size
        parent = hashes[start - 1] if start else None
        seq.held += self.cache.promote(new, parent, ids[start * size :], size)
        seq.anon -= len(new)

    def _finish_blocks(self, seq: SeqHandle) -> None:
        if seq.computed >= seq.prompt_tokens:
            # The answer's full blocks are cached under the next turn's rendering.
            done = (seq.prompt_tokens + seq.generated) // self.profile.block_size
            self._promote(seq, seq.final_hashes[:done], seq.final_ids)
        self.cache.release(seq.held, seq.anon)
        seq.held, seq.anon = [], 0
