"""Calibrate a simulator profile: measure prefill and decode of a model shape with PyTorch.

Builds a Llama-shaped decoder (token embedding, ``layers`` x [RMSNorm, grouped-query attention,
RMSNorm, SwiGLU MLP], final RMSNorm, LM head) with **random weights** of the shape's
``config.json`` figures, on this machine's GPU when there is one (BF16) and else the CPU
(FP32), and measures:

* prefill throughput: one causal forward pass over a prompt of ``--prefill-tokens`` tokens;
* the decode step time for each batch size of ``--batches`` at two context lengths
  (``--contexts``): one token per sequence, attention over a KV cache of that length.

It then fits the simulator's step-time model (``vllm_sim.profiles.PerfProfile.step_time_s``)
and writes a profile JSON file that ``vllm-sim --profile PATH`` loads. Nothing is downloaded:
the shapes are written out below. Torch is not a project dependency; run this with the torch
venv (``make calibrate-sim``, see docs/simulator.md)::

    .tools/torch-venv/bin/python bench/calibrate_sim.py --shape tiny --out tiny.json

Omitted from the measured model (small next to the matrix products): rotary position
embeddings, sampling, and vLLM's paged-attention kernels and CUDA graphs. The numbers are what
PyTorch eager reaches on this machine, not what vLLM reaches on it.

Sources of the shapes:

* ``llama-3.1-8b``: ``meta-llama/Llama-3.1-8B-Instruct`` ``config.json`` (hidden 4096,
  intermediate 14336, 32 layers, 32 heads, 8 KV heads, vocab 128256).
* ``qwen3-32b``: ``Qwen/Qwen3-32B`` ``config.json`` (hidden 5120, intermediate 25600, 64 layers,
  64 heads, 8 KV heads, head dim 128, vocab 151936).
* ``tiny``: a test shape with no model behind it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

# The CPU wheel warns at import that numpy is missing; nothing here uses numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """The ``config.json`` figures of a Llama-family decoder.

    Attributes:
        hidden: ``hidden_size``.
        intermediate: ``intermediate_size`` of the SwiGLU MLP.
        layers: ``num_hidden_layers``.
        heads: ``num_attention_heads``.
        kv_heads: ``num_key_value_heads`` (grouped-query attention).
        head_dim: ``head_dim`` (``hidden_size / num_attention_heads`` when absent).
        vocab: ``vocab_size``.
    """

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    def params(self) -> int:
        """Parameter count: per layer q, k, v, o projections and three MLP matrices, plus the
        embedding and the (untied) LM head. Norm weights are left out (< 0.01 %)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp) + 2 * self.vocab * self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes per token = 2 (K and V) x layers x KV heads x head dim x dtype bytes
        (the figure vLLM's ``CacheConfig`` sizes its blocks by)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


SHAPES: dict[str, Shape] = {
    "llama-3.1-8b": Shape(4096, 14336, 32, 32, 8, 128, 128256),
    "qwen3-32b": Shape(5120, 25600, 64, 64, 8, 128, 151936),
    "tiny": Shape(256, 768, 2, 4, 2, 64, 1024),
}
"""Model shapes by name (sources in the module docstring)."""


CPU_KV_CACHE_GIB = 4.0
"""KV cache on the CPU without ``--kv-cache-gib``: vLLM's CPU backend default (GiB)."""


class CalibrationError(ValueError):
    """A bad argument (named in the message) or a fit that cannot give a profile."""


class _Decoder:
    """A random-weight Llama-shaped decoder for timing (not for generating text)."""

    def __init__(self, shape: Shape, layers: int, device: torch.device, dtype: torch.dtype):
        gen = torch.Generator(device="cpu").manual_seed(0)
        std = 0.02

        def w(*size: int) -> torch.Tensor:
            return (torch.randn(*size, generator=gen) * std).to(device=device, dtype=dtype)

        s = shape
        self.shape, self.device, self.dtype = s, device, dtype
        self.embed = w(s.vocab, s.hidden)
        self.lm_head = w(s.vocab, s.hidden)
        self.layers = [
            {
                "wq": w(s.heads * s.head_dim, s.hidden),
                "wk": w(s.kv_heads * s.head_dim, s.hidden),
                "wv": w(s.kv_heads * s.head_dim, s.hidden),
                "wo": w(s.hidden, s.heads * s.head_dim),
                "gate": w(s.intermediate, s.hidden),
                "up": w(s.intermediate, s.hidden),
                "down": w(s.hidden, s.intermediate),
            }
            for _ in range(layers)
        ]

    @staticmethod
    def _norm(x: torch.Tensor) -> torch.Tensor:
        # RMSNorm (Zhang & Sennrich 2019) without its weight: x / sqrt(mean(x^2) + eps).
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def forward(
        self, tokens: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]] | None
    ) -> torch.Tensor:
        """Logits of the last position of each sequence.

        Args:
            tokens: ``[batch, new_tokens]`` token ids.
            cache: Per layer ``(k, v)`` of shape ``[batch, kv_heads, ctx, head_dim]``: the
                context the new tokens attend to besides themselves (decode), or None (prefill:
                causal attention over the new tokens only).

        Returns:
            ``[batch, vocab]`` logits.
        """
        s = self.shape
        b, n = tokens.shape
        x = self.embed[tokens]
        group = s.heads // s.kv_heads
        for i, lw in enumerate(self.layers):
            h = self._norm(x)
            q = (h @ lw["wq"].T).view(b, n, s.heads, s.head_dim).transpose(1, 2)
            k = (h @ lw["wk"].T).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
            v = (h @ lw["wv"].T).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
            if cache is not None:
                ck, cv = cache[i]
                k = torch.cat([ck, k], dim=2)
                v = torch.cat([cv, v], dim=2)
            # Grouped-query attention (Ainslie et al. 2023): each KV head serves `group` heads.
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
            x = x + a.transpose(1, 2).reshape(b, n, s.heads * s.head_dim) @ lw["wo"].T
            h = self._norm(x)
            # SwiGLU MLP (Shazeer 2020): down(silu(gate(h)) * up(h)).
            x = x + (F.silu(h @ lw["gate"].T) * (h @ lw["up"].T)) @ lw["down"].T
        return self._norm(x[:, -1]) @ self.lm_head.T

    def kv_cache(self, batch: int, ctx: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A random KV cache of ``ctx`` tokens for each of ``batch`` sequences, per layer."""
        s = self.shape
        size = (batch, s.kv_heads, ctx, s.head_dim)
        return [
            (
                torch.randn(size, device=self.device, dtype=self.dtype),
                torch.randn(size, device=self.device, dtype=self.dtype),
            )
            for _ in self.layers
        ]


def _time_s(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` runs after one warm-up run, seconds."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        fn()
        sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fit_decode(samples: Sequence[tuple[int, int, float]]) -> tuple[float, float, float]:
    """Least-squares fit of the simulator's decode step model to measured steps.

    The model is ``PerfProfile.step_time_s`` without prefill:
    ``t = base + per_seq x batch + per_ctx_token x (batch x ctx)`` (vllm_sim/profiles.py),
    solved as ordinary least squares ``min ||A c - t||^2`` with rows ``[1, batch, batch x ctx]``
    (``torch.linalg.lstsq``). A coefficient the fit makes negative (noise) is set to 0 and the
    others refitted, since the profile requires each >= 0.

    Args:
        samples: ``(batch, ctx_tokens, step_seconds)`` measurements; at least three with two
            context lengths.

    Returns:
        ``(decode_base_s, decode_per_seq_s, decode_per_ctx_token_s)``.

    Raises:
        CalibrationError: Fewer than three samples or a single context length.
    """
    if len(samples) < 3 or len({c for _, c, _ in samples}) < 2:
        raise CalibrationError("decode fit: needs >= 3 samples at >= 2 context lengths")
    rows = [[1.0, float(b), float(b * c)] for b, c, _ in samples]
    t = torch.tensor([[s] for _, _, s in samples], dtype=torch.float64)
    keep = [0, 1, 2]
    while True:
        a = torch.tensor([[r[j] for j in keep] for r in rows], dtype=torch.float64)
        coef = torch.linalg.lstsq(a, t).solution.flatten().tolist()
        neg = [j for j, c in zip(keep, coef, strict=True) if c < 0]
        if not neg:
            break
        keep.remove(neg[0])
        if not keep:
            return (0.0, 0.0, 0.0)
    full = [0.0, 0.0, 0.0]
    for j, c in zip(keep, coef, strict=True):
        full[j] = c
    return (full[0], full[1], full[2])


def calibrate(
    shape_name: str,
    *,
    layers: int | None,
    device_name: str,
    prefill_tokens: int,
    batches: Sequence[int],
    contexts: Sequence[int],
    repeats: int,
    kv_cache_gib: float | None,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Measure ``shape_name`` on this machine and return the profile's fields.

    Layers are identical, so with ``layers`` < the shape's count the measured step times are
    scaled by ``shape layers / layers`` (this scales the embedding and LM head share too; it
    overstates them by that factor, a small error for deep stacks).

    ``num_gpu_blocks`` = KV-cache bytes // (KV bytes per token x ``block_size``), with the KV
    cache bytes either ``kv_cache_gib`` or, on a GPU, 0.9 x total memory - weights - 4 GiB
    (vLLM's default ``gpu_memory_utilization`` 0.9; 4 GiB for activations, as in
    vllm_sim/profiles.py), or on the CPU ``CPU_KV_CACHE_GIB`` (vLLM's CPU backend default
    ``VLLM_CPU_KVCACHE_SPACE``, 4 GiB).

    Returns:
        A dict with the fields of ``vllm_sim.profiles.PerfProfile``.

    Raises:
        CalibrationError: Unknown shape, bad sizes, no CUDA device when asked for one, or no
            room for a KV cache.
    """
    if shape_name not in SHAPES:
        raise CalibrationError(f"--shape: unknown {shape_name!r} (known: {', '.join(SHAPES)})")
    shape = SHAPES[shape_name]
    n_layers = shape.layers if layers is None else layers
    if not 1 <= n_layers <= shape.layers:
        raise CalibrationError(f"--layers: must be 1..{shape.layers}, got {n_layers}")
    for name, values in (("--batches", batches), ("--contexts", contexts)):
        if not values or min(values) < 1:
            raise CalibrationError(f"{name}: needs positive integers, got {list(values)}")
    if len(set(contexts)) < 2:
        raise CalibrationError(f"--contexts: needs two different lengths, got {list(contexts)}")
    if prefill_tokens < 1 or repeats < 1:
        raise CalibrationError("--prefill-tokens and --repeats must be >= 1")
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    if device_name == "cuda" and not torch.cuda.is_available():
        raise CalibrationError("--device cuda: no CUDA device visible to torch")
    device = torch.device(device_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype_bytes = torch.finfo(dtype).bits // 8
    scale = shape.layers / n_layers
    model = _Decoder(shape, n_layers, device, dtype)
    log(f"shape {shape_name}: {n_layers}/{shape.layers} layers on {device} ({dtype})")

    prompt = torch.randint(0, shape.vocab, (1, prefill_tokens), device=device)
    t_prefill = _time_s(lambda: model.forward(prompt, None), device, repeats) * scale
    prefill_tps = prefill_tokens / t_prefill
    log(f"prefill {prefill_tokens} tokens: {t_prefill * 1e3:.2f} ms -> {prefill_tps:,.0f} tokens/s")

    samples: list[tuple[int, int, float]] = []
    for ctx in contexts:
        for b in batches:
            cache = model.kv_cache(b, ctx)
            step_in = torch.randint(0, shape.vocab, (b, 1), device=device)
            t = _time_s(partial(model.forward, step_in, cache), device, repeats) * scale
            samples.append((b, ctx, t))
            log(f"decode batch {b:4d} ctx {ctx:6d}: {t * 1e3:.3f} ms/step")
    base, per_seq, per_ctx = fit_decode(samples)
    log(f"fit: base {base * 1e3:.3f} ms + {per_seq * 1e6:.2f} us/seq "
        f"+ {per_ctx * 1e9:.3f} ns/ctx token")

    weights = shape.params() * dtype_bytes
    if kv_cache_gib is not None:
        kv_bytes = kv_cache_gib * 1024**3
    elif device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        kv_bytes = 0.9 * total - weights - 4 * 1024**3
    else:
        kv_bytes = CPU_KV_CACHE_GIB * 1024**3
    blocks = int(kv_bytes // (shape.kv_bytes_per_token(dtype_bytes) * block_size))
    if blocks < 1:
        raise CalibrationError(f"no room for a KV cache: {kv_bytes / 1024**3:.1f} GiB left")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return {
        "name": f"{shape_name}-measured",
        "description": (
            f"{shape_name} random weights, {str(dtype).removeprefix('torch.')}, PyTorch "
            f"{torch.__version__} eager on {where}; measured by bench/calibrate_sim.py "
            f"({n_layers}/{shape.layers} layers, scaled x{scale:g})"
        ),
        "block_size": block_size,
        "num_gpu_blocks": blocks,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "prefill_tokens_per_s": prefill_tps,
        "decode_base_s": base,
        "decode_per_seq_s": per_seq,
        "decode_per_ctx_token_s": per_ctx,
    }


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        msg = f"not a comma-separated list of integers: {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; writes the profile JSON and logs the measurements to stderr.

    Returns:
        0 on success, 2 on a bad argument or an impossible fit.
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="tiny", help=f"one of {', '.join(SHAPES)}")
    p.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    p.add_argument("--layers", type=int, help="measure this many layers and scale (default all)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--prefill-tokens", type=int, default=512)
    p.add_argument("--batches", type=_ints, default=[1, 2, 4, 8, 16])
    p.add_argument("--contexts", type=_ints, default=[128, 512])
    p.add_argument("--repeats", type=int, default=5, help="timed runs per point (median)")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's)")
    p.add_argument(
        "--kv-cache-gib", type=float, help="KV cache size (default: derived on GPU, 4 on CPU)"
    )
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    args = p.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            print("calibrate_sim: --threads: must be >= 1", file=sys.stderr)
            return 2
        torch.set_num_threads(args.threads)
    try:
        profile = calibrate(
            args.shape,
            layers=args.layers,
            device_name=args.device,
            prefill_tokens=args.prefill_tokens,
            batches=args.batches,
            contexts=args.contexts,
            repeats=args.repeats,
            kv_cache_gib=args.kv_cache_gib,
            block_size=args.block_size,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            log=lambda line: print(line, file=sys.stderr),
        )
    except CalibrationError as exc:
        print(f"calibrate_sim: {exc}", file=sys.stderr)
        return 2
    if not all(math.isfinite(v) for v in profile.values() if isinstance(v, float)):
        print("calibrate_sim: a measured figure is not finite", file=sys.stderr)
        return 2
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(profile, indent=2) + "\n", encoding="utf-8")
    tmp.replace(args.out)  # nothing half-written
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
