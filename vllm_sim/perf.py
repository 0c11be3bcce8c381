"""Wiring of the engine model (:mod:`vllm_sim.engine`) into the app: build, pace, probe, report.

Only used when ``SimConfig.profile`` is set; every function accepts ``engine=None`` (no profile)
and then does nothing (or refuses, for ``/sim/prefix``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_sim.config import SimConfig
from vllm_sim.engine import Engine, SeqHandle
from vllm_sim.errors import BadRequest
from vllm_sim.inference import EnginePacer
from vllm_sim.kv_cache import block_hashes
from vllm_sim.profiles import PerfProfile, get_profile, load_profile
from vllm_sim.prompt import chat_text, completion_text, prompt_pieces
from vllm_sim.protocol import Generation, parse_completion
from vllm_sim.render import total_completion_tokens
from vllm_sim.tokens import output_tokens, piece_ids

__all__ = ["engine_for", "engine_stats", "pacer", "prefix_probe", "single_token_prompt"]


def engine_for(config: SimConfig) -> Engine | None:
    """The engine model of ``config.profile`` (``None`` without one).

    Raises:
        ProfileError: Unknown profile name or invalid profile file.
    """
    if config.profile is None:
        return None
    profile: PerfProfile
    if config.profile.endswith(".json"):
        profile = load_profile(Path(config.profile))
    else:
        profile = get_profile(config.profile)
    overrides = {"num_gpu_blocks": config.num_gpu_blocks,
                 "scheduling_policy": config.scheduling_policy,
                 "long_prefill_token_threshold": config.long_prefill_token_threshold}
    update = {k: v for k, v in overrides.items() if v is not None}
    if update:
        profile = profile.model_copy(update=update)
    return Engine(profile, config.time_scale)


def pacer(
    engine: Engine | None,
    gen: Generation,
    prompt: str,
    with_answer: Callable[[str], str],
    prompts: int,
    token_ids: list[int] | None = None,
) -> EnginePacer | None:
    """The engine pacing of a generation request, or ``None`` without a profile.

    Args:
        engine: The app's engine.
        gen: The validated generation request.
        prompt: The rendered prompt (:mod:`vllm_sim.prompt`).
        with_answer: Renders the conversation with a given answer appended (the next turn's
            prefix, cached when the request ends).
        prompts: Number of completion prompts (1 for chat).
        token_ids: A completions prompt given as token ids: the engine's tokens are these ids
            (as vLLM takes them), not the pieces of ``prompt``.
    """
    if engine is None:
        return None
    size = engine.profile.block_size
    answer = "".join(output_tokens(gen.completion_tokens))
    if token_ids is not None:
        ids = list(token_ids)
        final = ids + piece_ids(prompt_pieces(answer))
    else:
        ids = piece_ids(prompt_pieces(prompt))
        final = piece_ids(prompt_pieces(with_answer(answer)))
    seq = SeqHandle(
        prompt_hashes=block_hashes(ids, size),
        prompt_tokens=max(len(ids), 1),
        output_tokens=max(total_completion_tokens(gen, prompts), 1),
        final_hashes=block_hashes(final, size),
        priority=gen.priority,
        prompt_ids=ids,
        final_ids=final,
    )
    return EnginePacer(engine, seq)


def prefix_probe(engine: Engine | None, body: dict[str, Any], config: SimConfig) -> dict[str, int]:
    """``POST /sim/prefix``: how many tokens of this request's prompt are cached now.

    Raises:
        BadRequest: No profile, or neither ``messages`` nor a valid ``prompt``.
    """
    if engine is None:
        raise BadRequest("/sim/prefix needs a simulator profile", param="profile")
    ids: list[int] | None = None
    if isinstance(body.get("messages"), list):
        text = chat_text(body)
    elif "prompt" in body:
        _, prompts = parse_completion(body, config, engine.profile.scheduling_policy)
        ids = single_token_prompt(prompts)
        text = completion_text(prompts)
    else:
        raise BadRequest("'prompt' or 'messages' is required", param="prompt")
    if ids is None:
        ids = piece_ids(prompt_pieces(text))
    hashes = block_hashes(ids, engine.profile.block_size)
    return {"cached_tokens": engine.cached_tokens(hashes, len(ids)),
            "prompt_tokens": len(ids)}


def single_token_prompt(prompts: list[str | list[int]]) -> list[int] | None:
    """The token ids of a completions request with one prompt given as token ids."""
    if len(prompts) == 1 and isinstance(prompts[0], list):
        return list(prompts[0])
    return None


def engine_stats(engine: Engine) -> dict[str, Any]:
    """The ``engine`` member of ``GET /sim/stats``."""
    return {
        "profile": engine.profile.name,
        "waiting": len(engine.waiting),
        "running": len(engine.running),
        "kv_blocks_used": engine.cache.used,
        "num_gpu_blocks": engine.cache.num_blocks,
        "prefix_cache_queries": engine.queries_total,
        "prefix_cache_hits": engine.hits_total,
        "steps": engine.steps,
        "preemptions": engine.preemptions_total,
    }
