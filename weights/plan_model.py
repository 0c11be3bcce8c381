"""Layout-independent facts of a model for the capacity plan: parameters (total and active),
weights bytes, KV cache per token and per sequence (sliding-window layers included).

Built on :func:`weights.memory.size_model` (standard, grouped-query and multi-head latent
attention; MoE counted in total). Formulas:

* weights = parameters x bytes per parameter (MoE: all experts).
* KV per sequence = KV per token per layer x (full-attention layers x context + sliding-window
  layers x min(context, window)); vLLM's hybrid KV allocator keeps only the window for those.
* active parameters (multiplied per token) = total - untied input embedding (a row lookup) -
  routed expert parameters x (1 - k / E), k experts of E per token (``num_experts_per_tok``);
  routed expert parameters = MoE layers x E x 3 x hidden x ``moe_intermediate_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weights.errors import SizingError
from weights.memory import dtype_bytes, size_model
from weights.plan_types import ModelFacts, Workload
from weights.sizing import Figure, ParamCount, model_shape


def _int(cfg: Mapping[str, Any], *names: str) -> int | None:
    for n in names:
        v = cfg.get(n)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def sliding_window_layers(config: Mapping[str, Any], layers: int) -> tuple[int, int, str]:
    """How many layers use a sliding attention window, and its size in tokens.

    Reads ``layer_types`` (transformers >= 4.53: ``sliding_attention`` entries), else
    ``sliding_window`` with ``use_sliding_window`` (Qwen2: layers from ``max_window_layers``
    on), ``sliding_window_pattern`` (Gemma 3: every p-th layer is global), Gemma 2 (every other
    layer), or every layer (Mistral 7B v0.1).

    Returns:
        (sliding layers, window tokens, source); (0, 0, "") when the model has none.
    """
    sub = config.get("text_config")
    cfg: Mapping[str, Any] = sub if isinstance(sub, dict) else config
    window = _int(cfg, "sliding_window")
    types = cfg.get("layer_types")
    if isinstance(types, list) and window:
        n = sum(1 for t in types if t == "sliding_attention")
        return n, window, "config.json:layer_types, sliding_window"
    if not window or cfg.get("use_sliding_window") is False:
        return 0, 0, ""
    first = _int(cfg, "max_window_layers")
    if cfg.get("use_sliding_window") is True and first is not None:
        return max(0, layers - first), window, "config.json:sliding_window, max_window_layers"
    pattern = _int(cfg, "sliding_window_pattern")
    if pattern and pattern > 1:
        return layers - layers // pattern, window, "config.json:sliding_window_pattern"
    if str(cfg.get("model_type", "")) == "gemma2":
        return (layers + 1) // 2, window, "config.json:sliding_window (Gemma 2: alternate layers)"
    return layers, window, "config.json:sliding_window (every layer)"


def model_facts(config: Mapping[str, Any], params: ParamCount | None,
                work: Workload) -> ModelFacts:
    """Weights, parameters (total and active) and KV cache of one model for ``work``.

    Raises:
        SizingError: Missing config fields, unknown dtypes.
    """
    if work.context < 1 or work.concurrency < 1:
        raise SizingError("context and concurrency must be at least 1")
    base = size_model(config, params, dtype=work.dtype, kv_dtype=work.kv_dtype,
                      context=work.context, concurrency=1)
    shape = model_shape(config)
    cfg = shape.raw
    n = base.figure("parameters").value
    weights = base.figure("weights")
    el = dtype_bytes(work.dtype) if work.dtype else weights.value / n
    per_tok = base.figure("kv cache per token")
    L = int(shape.layers.value)
    figs = [base.figure("parameters"), weights, per_tok]
    n_slide, window, src = sliding_window_layers(config, L)
    per_layer = per_tok.value / L
    kv_seq = per_layer * ((L - n_slide) * work.context + n_slide * min(work.context, window))
    if n_slide:
        figs.append(Figure("sliding-window layers", n_slide, "layers",
                           f"{src}: window {window} tokens"))
    figs.append(Figure("kv cache per sequence", kv_seq, "bytes",
                       f"per token / {L} layers x ({L - n_slide} full x {work.context} "
                       f"(--context)" + (f" + {n_slide} sliding x min(context, {window})"
                                         if n_slide else "") + ")"))
    experts = _int(cfg, "n_routed_experts", "num_local_experts", "num_experts") or 0
    k = _int(cfg, "num_experts_per_tok", "moe_topk", "num_experts_per_token") or 0
    h = int(shape.hidden.value)
    vocab = _int(cfg, "vocab_size") or 0
    tied = bool(cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    # An untied input embedding is a row lookup: neither read whole nor multiplied per token.
    emb = float(vocab * h) if not tied and 2 * vocab * h < n else 0.0
    routed = 0.0
    if experts and k:
        moe_inter = _int(cfg, "moe_intermediate_size", "intermediate_size") or 0
        dense = _int(cfg, "first_k_dense_replace") or 0
        routed = float((L - dense) * experts * 3 * h * moe_inter)
    active = n - emb - routed * (1 - k / experts if experts and k else 0)
    src = "total" + (" - input embedding (config.json:vocab_size x hidden_size)" if emb else "")
    if routed:
        src += (f" - routed experts x (1 - {k}/{experts}) (config.json:num_experts_per_tok, "
                "moe_intermediate_size)")
    figs.append(Figure("active parameters", active, "params", src))
    mla = shape.mla is not None
    return ModelFacts(
        params=n, active_params=active, weights_bytes=weights.value, weight_el_bytes=el,
        kv_per_token=per_tok.value, kv_per_seq=kv_seq,
        kv_heads=1 if mla else int(shape.kv_heads.value),
        heads=int(shape.attention_heads.value), layers=L, experts=experts,
        experts_per_tok=k, routed_expert_params=routed, embedding_params=emb,
        max_context=_int(cfg, "max_position_embeddings"), figures=tuple(figs))
