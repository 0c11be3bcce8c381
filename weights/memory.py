"""Deployment memory arithmetic: weights, KV cache, fit and tensor-parallel degree.

KV cache bytes per token = 2 x layers x KV heads x head dim x bytes per element; for MLA
(DeepSeek-V2/V3: ``kv_lora_rank``) = (kv_lora_rank + qk_rope_head_dim) x layers x bytes.
Tensor parallelism splits weights and KV heads across GPUs; the degree must divide the
attention heads; beyond the KV heads, KV heads are replicated. Every figure names its source.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from weights.errors import SizingError
from weights.quantization import kv_cache_scheme, read_quantization
from weights.sizing import (
    DTYPE_BYTES,
    GB,
    GIB,
    Figure,
    ParamCount,
    estimate_params,
    model_shape,
)


def dtype_bytes(name: str) -> float:
    """Bytes per element of a dtype name (``bf16``, ``torch.bfloat16``, ``fp8``, ...).

    Raises:
        SizingError: Unknown dtype.
    """
    key = name.lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise SizingError(f"unknown dtype {name!r} (known: {', '.join(sorted(DTYPE_BYTES))})")
    return DTYPE_BYTES[key]


#: safetensors dtype -> the ``--dtype`` name of the same width.
_FROM_SAFETENSORS = {"F32": "fp32", "BF16": "bf16", "F16": "fp16", "F8_E4M3": "fp8_e4m3",
                     "F8_E5M2": "fp8_e5m2", "I8": "int8", "F4": "fp4"}
#: dtypes vLLM computes (and, with ``--kv-cache-dtype auto``, caches KV) in. Quantised weight
#: dtypes (fp8, int8, int4, ...) keep the activations, hence the KV cache, in one of these.
_ACTIVATION = {"fp32", "float32", "bf16", "bfloat16", "fp16", "float16", "half"}


@dataclass(frozen=True)
class Dtype:
    """A dtype and where it came from (``--dtype``, a config field, the headers, a default)."""

    name: str
    source: str

    def to_json(self) -> dict[str, str]:
        """JSON-ready dict."""
        return {"name": self.name, "source": self.source}


def model_dtype(config_dtype: str | None, config_source: str | None,
                params: ParamCount | None) -> Dtype:
    """The dtype the checkpoint is stored in: config.json ``torch_dtype``/``dtype``, else the
    dtype holding most parameters in the safetensors headers, else bf16 (said so).

    Raises:
        SizingError: The config names a dtype this tool does not know.
    """
    if config_dtype is not None and config_source is not None:
        dtype_bytes(config_dtype)
        return Dtype(config_dtype.removeprefix("torch."), f"{config_source}={config_dtype}")
    if params is not None and params.by_dtype:
        top, count = max(params.by_dtype.items(), key=lambda kv: kv[1])
        name = _FROM_SAFETENSORS.get(top)
        if name is not None:
            share = 100 * count / max(1, params.total)
            return Dtype(name, f"safetensors headers: {top} holds {share:.0f}% of parameters "
                               "(config.json has no torch_dtype/dtype)")
    return Dtype("bf16", "assumed bf16: neither config.json (torch_dtype/dtype) nor "
                         "safetensors headers name a dtype")


def parse_memory(text: str) -> int:
    """Parse a memory size: ``80`` or ``80GiB`` (GiB), ``80GB`` (10^9 bytes), ``512MiB``.

    Raises:
        SizingError: Malformed size.
    """
    units = {"gib": GIB, "gb": GB, "mib": 1024**2, "mb": 1000**2, "tib": 1024**4, "tb": 1000**4}
    t = text.strip().lower().replace(" ", "")
    for suffix, mult in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if t.endswith(suffix):
            t, factor = t[: -len(suffix)], mult
            break
    else:
        factor = GIB
    try:
        value = float(t)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SizingError(f"bad memory size {text!r}: a positive size, e.g. 80GiB or 80GB")
    return int(value * factor)


@dataclass(frozen=True)
class SizingReport:
    """The memory arithmetic of one deployment.

    Attributes:
        figures: Every figure with its unit and source, in presentation order.
        fits: Whether weights + KV fit on ``gpus`` GPUs (None if no GPU memory was given).
        min_gpus: Smallest tensor-parallel degree (power of two dividing the attention heads)
            that fits, or None.
        why_not: When ``fits`` is False, why (a tensor-parallel degree vLLM refuses for the
            head counts, or memory); otherwise None.
    """

    figures: tuple[Figure, ...]
    fits: bool | None
    min_gpus: int | None
    weights_dtype: Dtype | None = None
    kv_dtype: Dtype | None = None
    why_not: str | None = None

    def figure(self, name: str) -> Figure:
        """Return the figure called ``name``."""
        for f in self.figures:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"fits": self.fits, "min_gpus": self.min_gpus, "why_not": self.why_not,
                "dtypes": {"weights": self.weights_dtype.to_json() if self.weights_dtype
                           else None,
                           "kv_cache": self.kv_dtype.to_json() if self.kv_dtype else None},
                "figures": [f.to_json() for f in self.figures]}


def _cross_check(config: Mapping[str, Any], counted: int) -> list[Figure]:
    """The config estimate next to the header count, and how far apart they are (a header
    count far from what the architecture implies is worth a look: a partial or odd file set)."""
    try:
        est = estimate_params(config)
    except SizingError:
        return []
    gap = (counted - est.value) / est.value * 100 if est.value else 0.0
    return [Figure("parameters (config estimate)", est.value, "params",
                   f"{est.source}; safetensors headers count {gap:+.1f} % against it")]


def _embedding_params(cfg: Mapping[str, Any], hidden: int) -> int:
    """Embedding (and untied LM head) parameters: vocab_size x hidden (x 2 when untied)."""
    vocab = cfg.get("vocab_size")
    if not isinstance(vocab, int):
        return 0
    return vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)


def _per_gpu_bytes(weights: float, kv_total: float, kv_heads: int, tp: int) -> float:
    # KV heads split across ranks; replicated when tp exceeds them.
    kv_split = min(tp, kv_heads) if kv_heads > 0 else tp
    return weights / tp + kv_total / kv_split


def size_model(
    config: Mapping[str, Any],
    params: ParamCount | None = None,
    *,
    dtype: str | None = None,
    kv_dtype: str | None = None,
    context: int = 0,
    concurrency: int = 1,
    gpu_mem_bytes: int | None = None,
    gpus: int = 1,
    utilization: float = 0.9,
) -> SizingReport:
    """Compute weights, KV cache and fit.

    Args:
        config: The model's config.json.
        params: Counts from safetensors headers; None to estimate from config.
        dtype: Weights dtype to deploy in (default: the stored bytes of the headers, else the
            checkpoint dtype of :func:`model_dtype`).
        kv_dtype: KV cache dtype (default, as vLLM's ``--kv-cache-dtype auto``: ``dtype`` if
            it is an activation dtype (fp16/bf16/fp32), else the checkpoint dtype if it is
            one, else bf16). The report's ``weights_dtype``/``kv_dtype`` say which applied.
        context: Tokens per sequence (prompt + output).
        concurrency: Concurrent sequences.
        gpu_mem_bytes: Memory of one GPU in bytes; None to skip the fit.
        gpus: GPUs available (tensor parallel degree to check).
        utilization: Fraction of GPU memory vLLM may use (``--gpu-memory-utilization``).

    Raises:
        SizingError: Missing config fields or unknown dtypes.
    """
    shape = model_shape(config)
    figs: list[Figure] = [shape.layers, shape.attention_heads, shape.kv_heads, shape.head_dim]
    if params is not None:
        n = params.total
        for dt, count in params.by_dtype.items():
            figs.append(Figure(f"parameters {dt}", count, "params", params.source))
        figs.append(Figure("parameters", n, "params", params.source))
        figs += _cross_check(config, n)
    else:
        est = estimate_params(config)
        n = int(est.value)
        figs.append(est)
    stored = model_dtype(shape.dtype, shape.dtype_source, params)
    if dtype is not None:
        weights_dt = Dtype(dtype, "--dtype")
        w_bytes = n * dtype_bytes(dtype)
        figs.append(Figure("weights", w_bytes, "bytes", f"parameters x {dtype_bytes(dtype)} "
                                                        f"bytes ({dtype}, --dtype)"))
    elif params is not None:
        weights_dt = Dtype("as stored", "safetensors headers (each tensor in its own dtype)")
        w_bytes = params.stored_bytes
        figs.append(Figure("weights", w_bytes, "bytes", "safetensors dtypes x shapes"))
    elif (quant := read_quantization(config)) is not None:
        # Quantised linear weights at the scheme's width; embeddings and LM head stay in the
        # activation dtype (torch_dtype), as vLLM loads them.
        act = dtype_bytes(stored.name) if stored.name.lower() in _ACTIVATION else 2.0
        embed = _embedding_params(shape.raw, int(shape.hidden.value))
        weights_dt = Dtype(f"{quant.method} ({quant.bits:g} bits per weight)", quant.source)
        w_bytes = (n - embed) * quant.bits / 8 + embed * act
        figs.append(Figure("weights", w_bytes, "bytes",
                           f"(parameters - {embed} embedding/LM-head) x {quant.bits:g}/8 bytes "
                           f"({quant.source}) + embedding/LM-head x {act:g} bytes "
                           f"({stored.source})"))
    else:
        weights_dt = stored
        w_bytes = n * dtype_bytes(stored.name)
        figs.append(Figure("weights", w_bytes, "bytes",
                           f"parameters x {dtype_bytes(stored.name)} bytes ({stored.source})"))
    # vLLM's --kv-cache-dtype auto caches KV in the dtype the model computes in: the --dtype
    # asked for when that is an activation dtype (fp16, bf16, fp32), else (quantised weights)
    # the checkpoint's own dtype.
    if kv_dtype is not None:
        kv = Dtype(kv_dtype, "--kv-dtype")
    elif dtype is not None and dtype.lower().removeprefix("torch.") in _ACTIVATION:
        kv = Dtype(dtype, "--dtype (vLLM --kv-cache-dtype auto follows the model dtype)")
    elif stored.name.lower() in _ACTIVATION:
        kv = Dtype(stored.name, f"{stored.source} (vLLM --kv-cache-dtype auto)")
    else:
        kv = Dtype("bf16", f"bf16 activations of {stored.name} weights (vLLM "
                           "--kv-cache-dtype auto)")
    declared = kv_cache_scheme(config)
    if declared is not None and kv_dtype is None:
        kv = Dtype(kv.name, f"{kv.source}; the checkpoint declares a {declared} KV cache: "
                            "give --kv-dtype fp8 to size it as vLLM --kv-cache-dtype fp8")
    kv_el = dtype_bytes(kv.name)
    kv_src = f"{kv.name}: {kv.source}"
    L = int(shape.layers.value)
    if shape.mla is not None:
        rank, rope = shape.mla
        per_token = (rank.value + rope.value) * L * kv_el
        src = (f"({rank.source} + {rope.source}) x {shape.layers.source} x {kv_el} bytes "
               f"({kv_src}); MLA compressed latent")
        kv_heads = 1
    else:
        kv_heads = int(shape.kv_heads.value)
        per_token = 2 * L * kv_heads * shape.head_dim.value * kv_el
        src = (f"2 x {shape.layers.source} x {shape.kv_heads.source} x "
               f"{shape.head_dim.source} x {kv_el} bytes ({kv_src})")
    figs.append(Figure("kv cache per token", per_token, "bytes", src))
    kv_total = per_token * context * concurrency
    figs.append(Figure("kv cache", kv_total, "bytes",
                       f"per token x {context} tokens (--context) x {concurrency} (--concurrency)"))
    fits: bool | None = None
    min_gpus: int | None = None
    if gpu_mem_bytes is not None:
        usable = gpu_mem_bytes * utilization
        total_mem = gpu_mem_bytes * gpus
        figs.append(Figure("gpu memory total", total_mem, "bytes",
                           f"{gpus} GPUs (--gpus) x {gpu_mem_bytes} bytes (--gpu-mem)"))
        figs.append(Figure("free after weights", total_mem - w_bytes, "bytes",
                           "gpu memory total - weights"))
        per_gpu = _per_gpu_bytes(w_bytes, kv_total, kv_heads, gpus)
        figs.append(Figure("needed per gpu", per_gpu, "bytes",
                           f"weights / {gpus} + kv cache split over KV heads (tensor parallel)"))
        figs.append(Figure("usable per gpu", usable, "bytes",
                           f"--gpu-mem x {utilization} (--utilization)"))
        heads = int(shape.attention_heads.value)
        fits = per_gpu <= usable and heads % gpus == 0
        tp = 1
        while tp <= 1024:
            if heads % tp == 0 and _per_gpu_bytes(w_bytes, kv_total, kv_heads, tp) <= usable:
                min_gpus = tp
                break
            tp *= 2
        if per_token > 0:
            spare = usable * gpus - w_bytes
            figs.append(Figure("kv capacity", max(0, spare) // per_token, "tokens",
                               "(usable per gpu x gpus - weights) / kv cache per token"))
    return SizingReport(figures=tuple(figs), fits=fits, min_gpus=min_gpus,
                        weights_dtype=weights_dt, kv_dtype=kv)
