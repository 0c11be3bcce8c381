"""Named performance profiles of the simulator's engine model (``SimConfig.profile``).

A profile gives the numbers the engine model (:mod:`vllm_sim.engine`) runs on: KV cache size,
scheduler limits, prefill throughput and the decode step time as a function of the batch. The
shipped profiles are *derived*, not measured: a roofline estimate from the GPU's datasheet and
the model's ``config.json``, with an efficiency factor stated next to each number. A measured
profile can be loaded from a JSON file (``load_profile``), in the same fields.

Sources used by the shipped profiles:

* [H100] NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 80 GB HBM3, 3.35 TB/s memory
  bandwidth, 989 TFLOPS dense BF16 (the datasheet's 1,979 TFLOPS is with 2:4 sparsity).
* [L8B] ``meta-llama/Llama-3.1-8B-Instruct`` ``config.json``: 32 layers, 8 KV heads, head dim
  128 (4096 / 32 heads), 8.03 B parameters (16.1 GB in BF16).
* [Q32B] ``Qwen/Qwen3-32B`` ``config.json``: 64 layers, 8 KV heads, head dim 128, 32.8 B
  parameters (65.5 GB in BF16). The model of llm-d's prefix-cache scheduling benchmark.
* [VLLM-ARGS] vLLM ``EngineArgs.get_batch_defaults`` (``vllm/engine/arg_utils.py``): on GPUs
  with >= 70 GiB other than A100 the OpenAI server defaults to ``max_num_batched_tokens`` 8192 and
  ``max_num_seqs`` 1024; ``block_size`` 16 (``CacheConfig``); ``gpu_memory_utilization`` 0.9.

Formulas (per GPU, BF16, 2 bytes per value):

* KV bytes per token = 2 (K and V) x layers x KV heads x head dim x 2 bytes.
* ``num_gpu_blocks`` = (0.9 x 80 GiB - weights - ~4 GiB activations and CUDA graphs)
  / (KV bytes per token x 16).
* Prefill: 2 x parameters FLOP per token at 40 % of dense BF16 peak.
* Decode step = weights / (80 % of HBM bandwidth) + 1 ms scheduling and launch overhead
  (``decode_base_s``), plus 2 x parameters FLOP per sequence at 40 % of peak
  (``decode_per_seq_s``), plus the KV bytes each sequence reads per context token at 80 % of
  bandwidth (``decode_per_ctx_token_s``).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vllm_sim.waiting import SchedulingPolicy

__all__ = ["PROFILES", "PerfProfile", "ProfileError", "get_profile", "load_profile"]


class ProfileError(ValueError):
    """A profile name is unknown or a profile file is unreadable or invalid."""


class PerfProfile(BaseModel):
    """The numbers of one replica's performance model (immutable).

    Attributes:
        name: Profile name.
        description: Model, GPU and where the numbers come from.
        block_size: Tokens per KV-cache block (vLLM: 16).
        num_gpu_blocks: KV-cache blocks of the replica.
        max_num_seqs: Sequences in the running batch at most.
        max_num_batched_tokens: Tokens (prefill chunks plus one per decoding sequence) per step.
        prefill_tokens_per_s: Prefill throughput of uncached prompt tokens, tokens per second.
        decode_base_s: Decode step time with an empty batch, seconds.
        decode_per_seq_s: Added step time per running sequence, seconds.
        decode_per_ctx_token_s: Added step time per context token of the decoding sequences,
            seconds (attention reads the KV cache).
        long_prefill_token_threshold: Prompt tokens one request may prefill per step at most
            (vLLM's ``--long-prefill-token-threshold``; 0: no cap, vLLM's default with one
            partial prefill at a time).
        scheduling_policy: Order of the waiting queue (vLLM's ``--scheduling-policy``):
            ``fcfs`` or ``priority`` (:mod:`vllm_sim.waiting`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    block_size: int = Field(default=16, ge=1)
    num_gpu_blocks: int = Field(ge=1)
    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=1)
    prefill_tokens_per_s: float = Field(gt=0)
    decode_base_s: float = Field(ge=0)
    decode_per_seq_s: float = Field(ge=0)
    decode_per_ctx_token_s: float = Field(default=0.0, ge=0)
    long_prefill_token_threshold: int = Field(default=0, ge=0)
    scheduling_policy: SchedulingPolicy = "fcfs"

    def step_time_s(self, prefill_tokens: int, decode_seqs: int, decode_ctx_tokens: int) -> float:
        """Duration of one engine step in seconds (model time, before any time scale).

        ``max(prefill_tokens / prefill_tokens_per_s, decode_base_s) + decode_per_seq_s x
        decode_seqs + decode_per_ctx_token_s x decode_ctx_tokens``: the weights are read once
        per step, hidden under a compute-bound prefill chunk; a step without decodes is the
        same without the last two terms, an empty step 0.

        Args:
            prefill_tokens: Uncached prompt tokens computed in this step.
            decode_seqs: Sequences generating a token in this step.
            decode_ctx_tokens: Context tokens (prompt plus output so far) of those sequences.
        """
        prefill = prefill_tokens / self.prefill_tokens_per_s
        if not decode_seqs:
            return max(prefill, self.decode_base_s) if prefill_tokens else 0.0
        # One forward pass reads the weights once (``decode_base_s``, memory-bound) while the
        # prefill chunk's matrix products are compute-bound: the step takes the longer of the
        # two (roofline), not their sum, so decodes piggybacked on a prefill chunk cost only
        # their own compute and KV reads (Agrawal et al., "Taming Throughput-Latency Tradeoff
        # in LLM Inference with Sarathi-Serve", OSDI 2024).
        return (
            max(prefill, self.decode_base_s)
            + self.decode_per_seq_s * decode_seqs
            + self.decode_per_ctx_token_s * decode_ctx_tokens
        )

    def request_cost_s(self, prompt_tokens: int, output_tokens: int, batch: int) -> float:
        """GPU time one request costs when nothing of its prompt is cached, seconds.

        Prefill of the whole prompt plus its share of ``output_tokens`` decode steps run at
        batch size ``batch`` (used to estimate a fleet's capacity, see ``bench/routing.py``).
        """
        ctx = prompt_tokens + output_tokens // 2
        step = self.step_time_s(0, batch, batch * ctx)
        return prompt_tokens / self.prefill_tokens_per_s + output_tokens * step / batch


_GIB = 1024**3
_BW = 3.35e12 * 0.8  # [H100] bandwidth at 80 %
_FLOPS = 989e12 * 0.4  # [H100] dense BF16 at 40 %


def _blocks(weights_bytes: float, layers: int, kv_heads: int, head_dim: int) -> int:
    kv_token = 2 * layers * kv_heads * head_dim * 2
    free = 0.9 * 80 * _GIB - weights_bytes - 4 * _GIB
    return int(free // (kv_token * 16))


def _kv_token_s(layers: int, kv_heads: int, head_dim: int) -> float:
    return 2 * layers * kv_heads * head_dim * 2 / _BW


def _h100_roofline(
    name: str, description: str, *, weights_bytes: float, params: float, layers: int,
    kv_heads: int, head_dim: int,
) -> PerfProfile:
    """A dense BF16 model on one H100 SXM, from the roofline (sources [H100], [VLLM-ARGS]).

    Prefill is compute-bound (2 FLOPs per parameter per token); a decode step reads the weights
    once (plus 1 ms of engine overhead), each sequence adds its own 2 FLOPs per parameter, and
    each context token its K and V (:func:`_kv_token_s`).

    Args:
        name: Profile name.
        description: One line with the sources.
        weights_bytes: Weights in bytes (BF16).
        params: Parameter count.
        layers: Decoder layers.
        kv_heads: Key/value heads per layer.
        head_dim: Dimension per head.
    """
    return PerfProfile(
        name=name,
        description=description,
        num_gpu_blocks=_blocks(weights_bytes, layers, kv_heads, head_dim),
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        prefill_tokens_per_s=round(_FLOPS / (2 * params)),
        decode_base_s=weights_bytes / _BW + 0.001,
        decode_per_seq_s=2 * params / _FLOPS,
        decode_per_ctx_token_s=_kv_token_s(layers, kv_heads, head_dim),
    )


PROFILES: dict[str, PerfProfile] = {
    p.name: p
    for p in (
        _h100_roofline(
            "llama-3.1-8b-h100",
            "Llama-3.1-8B BF16 on one H100 SXM (roofline from [H100], [L8B], "
            "[VLLM-ARGS]; see vllm_sim/profiles.py)",
            # ~27,100 blocks; ~24,600 prefill tokens/s; decode ~7.0 ms + ~41 us/seq + ~49 ns/token
            weights_bytes=16.1e9, params=8.03e9, layers=32, kv_heads=8, head_dim=128,
        ),
        _h100_roofline(
            "qwen3-32b-h100",
            "Qwen3-32B BF16 on one H100 SXM (roofline from [H100], [Q32B], "
            "[VLLM-ARGS]; see vllm_sim/profiles.py). A small KV cache: the setting where "
            "prefix-aware routing matters",
            # ~1,790 blocks; ~6,030 prefill tokens/s; decode ~25.4 ms + ~166 us/seq + ~98 ns/token
            weights_bytes=65.5e9, params=32.8e9, layers=64, kv_heads=8, head_dim=128,
        ),
        PerfProfile(
            name="tiny-test",
            description="A tiny replica for tests: 64 blocks of 16 tokens, 4 sequences, "
            "fast steps (no hardware behind these numbers)",
            num_gpu_blocks=64,
            max_num_seqs=4,
            max_num_batched_tokens=512,
            prefill_tokens_per_s=20_000.0,
            decode_base_s=0.002,
            decode_per_seq_s=0.0005,
        ),
    )
}
"""The shipped profiles by name."""


def get_profile(name: str) -> PerfProfile:
    """The shipped profile ``name``.

    Raises:
        ProfileError: No such profile (the message lists the known names).
    """
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ProfileError(f"unknown profile {name!r} (known: {known})") from None


def load_profile(path: Path) -> PerfProfile:
    """A profile from a JSON file with the fields of :class:`PerfProfile`.

    Raises:
        ProfileError: The file cannot be read, is not JSON, or a field is invalid (the message
            names the file and the field).
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return PerfProfile.model_validate(data)
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read profile: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from exc
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "profile"
        raise ProfileError(f"{path}: {where}: {err['msg']}") from exc
