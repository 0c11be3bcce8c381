"""Model size facts: parameter counts from safetensors headers or config, architecture figures.

The deployment arithmetic built on them (KV cache, fit, tensor parallelism) is in
:mod:`weights.memory`.

Sources:

* Parameter counts: safetensors headers (format: 8-byte little-endian header length, then a
  JSON object ``{name: {dtype, shape, data_offsets}}``, per the safetensors specification);
  no tensor data is read. Without safetensors, an estimate from ``config.json`` (llama-style
  decoder: embeddings, attention, gated MLP, norms; mixture-of-experts counted with all
  experts, i.e. total, not active, parameters).
* KV cache bytes per token = 2 x layers x KV heads x head dim x bytes per element; for MLA
  (DeepSeek-V2/V3: ``kv_lora_rank``) = (kv_lora_rank + qk_rope_head_dim) x layers x bytes.
* Tensor parallelism splits weights and KV heads across GPUs; the degree must divide the
  attention heads; when it exceeds the KV heads, KV heads are replicated.

Every figure carries the config field or file it came from.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weights.errors import SizingError
from weights.safetensors_format import MalformedSafetensors, read_safetensors_header

#: Bytes per element of safetensors dtypes (safetensors specification).
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
    "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
    "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
}

#: Bytes per element of the dtypes accepted by ``--dtype`` / ``--kv-dtype``.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2,
    "fp8": 1, "float8": 1, "int8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int4": 0.5, "fp4": 0.5,
}

GB = 1000**3
GIB = 1024**3


@dataclass(frozen=True)
class Figure:
    """A number with its unit and provenance (config field, file or formula)."""

    name: str
    value: float
    unit: str
    source: str

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict; counts are integers (bytes rounded up, tokens down)."""
        return {"name": self.name, "value": json_number(self.value, self.unit), "unit": self.unit,
                "source": self.source}


def json_number(value: float, unit: str) -> int | float:
    """``value`` as JSON shows it: an integer for whole quantities (bytes rounded up, e.g.
    int4 halves; tokens and parameters rounded down), else as is."""
    if unit == "bytes":
        return math.ceil(value)
    if unit in ("tokens", "params"):
        return math.floor(value)
    return int(value) if float(value).is_integer() else value


@dataclass(frozen=True)
class ParamCount:
    """Parameters by safetensors dtype (``{"BF16": n, ...}``), and their stored bytes."""

    by_dtype: Mapping[str, int]
    stored_bytes: int
    source: str

    @property
    def total(self) -> int:
        """Total parameter count."""
        return sum(self.by_dtype.values())


def parse_header(length_prefix: bytes, read: Callable[[int], bytes], size: int) -> dict[str, Any]:
    """Parse a safetensors header as strictly as the reference loader
    (:func:`weights.safetensors_format.read_safetensors_header`), given its 8-byte prefix, a
    ``read(n) -> bytes`` callable for the header, and the file size in bytes (the tensors must
    cover the file exactly: a negative, overflowing or missing shape never reaches a count).

    Returns:
        ``{name: {"dtype", "shape", "data_offsets"}}`` (and ``"__metadata__"`` when present).

    Raises:
        SizingError: Truncated or malformed header (the reason in the message).
    """
    prefix = [length_prefix]

    def _read(n: int) -> bytes:
        return prefix.pop() if prefix else read(n)

    try:
        header = read_safetensors_header(_read, size)
    except MalformedSafetensors as exc:
        raise SizingError(exc.message) from exc
    doc: dict[str, Any] = {t.name: {"dtype": t.dtype, "shape": list(t.shape),
                                    "data_offsets": [t.begin, t.end]} for t in header.tensors}
    if header.metadata is not None:
        doc["__metadata__"] = dict(header.metadata)
    return doc


def read_header_file(path: Path) -> dict[str, Any]:
    """Read and validate the header of a local safetensors file (no tensor data is read).

    Raises:
        SizingError: Unreadable or malformed file (message names it).
    """
    try:
        with open(path, "rb") as fh:
            return parse_header(fh.read(8), fh.read, os.fstat(fh.fileno()).st_size)
    except OSError as exc:
        raise SizingError(f"{path}: {exc.strerror or exc}") from exc
    except SizingError as exc:
        raise SizingError(f"{path}: {exc.message}") from exc


def count_params(headers: Iterable[tuple[str, Mapping[str, Any]]]) -> ParamCount:
    """Count parameters by dtype over ``(file name, header)`` pairs.

    Raises:
        SizingError: A tensor entry has an unknown dtype or a malformed shape.
    """
    by_dtype: dict[str, int] = {}
    stored = 0.0
    names: list[str] = []
    for fname, header in headers:
        names.append(fname)
        for tname, t in header.items():
            if tname == "__metadata__":
                continue
            try:
                dtype = str(t["dtype"])
                n = math.prod(int(d) for d in t["shape"])
                width = SAFETENSORS_DTYPE_BYTES[dtype]
            except (KeyError, TypeError, ValueError) as exc:
                raise SizingError(f"{fname}: tensor {tname}: bad entry ({exc})") from exc
            by_dtype[dtype] = by_dtype.get(dtype, 0) + n
            stored += n * width
    src = names[0] if len(names) == 1 else f"{len(names)} safetensors headers"
    return ParamCount(by_dtype=dict(sorted(by_dtype.items())), stored_bytes=int(stored),
                      source=src)


def local_safetensors(root: Path) -> list[Path]:
    """Safetensors files of a local checkpoint: those named by an index, else all."""
    for idx in sorted(root.glob("*.safetensors.index.json")):
        try:
            weight_map = json.loads(idx.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise SizingError(f"{idx}: unreadable index: {exc}") from exc
        files = sorted({str(v) for v in weight_map.values()})
        missing = [f for f in files if not (root / f).is_file()]
        if missing:
            raise SizingError(f"{idx}: shards missing: {', '.join(missing)}")
        return [root / f for f in files]
    return sorted(root.glob("*.safetensors"))


@dataclass(frozen=True)
class ModelShape:
    """Architecture figures read from config.json, each with its source field."""

    layers: Figure
    attention_heads: Figure
    kv_heads: Figure
    head_dim: Figure
    hidden: Figure
    dtype: str | None
    mla: tuple[Figure, Figure] | None = None  # (kv_lora_rank, qk_rope_head_dim)
    dtype_source: str | None = None  # e.g. "config.json:torch_dtype"; None when absent
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)


def _text_config(cfg: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict) and "num_hidden_layers" in sub:
            return sub, f"{key}."
    return cfg, ""


def _field(cfg: Mapping[str, Any], prefix: str, names: tuple[str, ...], label: str) -> Figure:
    for n in names:
        v = cfg.get(n)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return Figure(label, v, "", f"config.json:{prefix}{n}")
    raise SizingError(f"config.json has none of {', '.join(prefix + n for n in names)}")


def model_shape(config: Mapping[str, Any]) -> ModelShape:
    """Read the architecture figures from a config.json mapping.

    Raises:
        SizingError: A required field is absent.
    """
    cfg, p = _text_config(config)
    layers = _field(cfg, p, ("num_hidden_layers", "n_layer", "num_layers"), "layers")
    hidden = _field(cfg, p, ("hidden_size", "n_embd", "d_model"), "hidden size")
    heads = _field(cfg, p, ("num_attention_heads", "n_head"), "attention heads")
    try:
        kv = _field(cfg, p, ("num_key_value_heads", "num_kv_heads", "n_head_kv"), "KV heads")
    except SizingError:
        kv = Figure("KV heads", heads.value, "", f"{heads.source} (no num_key_value_heads: MHA)")
    try:
        hd = _field(cfg, p, ("head_dim",), "head dim")
    except SizingError:
        hd = Figure("head dim", hidden.value // heads.value, "",
                    f"{hidden.source} / {heads.source}")
    mla = None
    if isinstance(cfg.get("kv_lora_rank"), int) and cfg.get("kv_lora_rank"):
        mla = (_field(cfg, p, ("kv_lora_rank",), "kv_lora_rank"),
               _field(cfg, p, ("qk_rope_head_dim",), "qk_rope_head_dim"))
    dtype, dtype_source = None, None
    # transformers writes ``torch_dtype`` (``dtype`` since 4.56); multimodal configs may keep
    # it in the text sub-config or only at the top.
    for where, prefix in ((cfg, p), (config, "")):
        for key in ("torch_dtype", "dtype"):
            value = where.get(key)
            if isinstance(value, str) and value and dtype is None:
                dtype, dtype_source = value, f"config.json:{prefix}{key}"
    return ModelShape(layers=layers, attention_heads=heads, kv_heads=kv, head_dim=hd,
                      hidden=hidden, dtype=dtype, mla=mla, raw=cfg, dtype_source=dtype_source)


def _mla_attention(cfg: Mapping[str, Any], p: str, h: int, heads: int) -> tuple[int, list[str]]:
    """Parameters of one multi-head latent attention block (DeepSeek-V2/V3), with its real
    shapes (transformers ``DeepseekV3Attention``): ``q_a_proj`` h x q_lora_rank, its norm,
    ``q_b_proj`` q_lora_rank x heads x (qk_nope + qk_rope) (or ``q_proj`` h x heads x
    (qk_nope + qk_rope) without q_lora_rank), ``kv_a_proj_with_mqa`` h x (kv_lora_rank +
    qk_rope), its norm, ``kv_b_proj`` kv_lora_rank x heads x (qk_nope + v_head_dim), ``o_proj``
    heads x v_head_dim x h.

    Raises:
        SizingError: A required MLA field is absent.
    """
    def get(name: str) -> int:
        return int(_field(cfg, p, (name,), name).value)

    nope, rope, v, kv_rank = (get("qk_nope_head_dim"), get("qk_rope_head_dim"),
                              get("v_head_dim"), get("kv_lora_rank"))
    q_rank = cfg.get("q_lora_rank")
    qk = heads * (nope + rope)
    q = h * int(q_rank) + int(q_rank) + int(q_rank) * qk if q_rank else h * qk
    kv = h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v)
    fields = ["q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
              "v_head_dim"]
    return q + kv + heads * v * h, fields


def estimate_params(config: Mapping[str, Any]) -> Figure:
    """Estimate the total parameter count of a llama-style decoder from config.json.

    Counts embeddings (and an untied LM head), per layer q/k/v/o projections (multi-head
    latent attention with its own shapes, :func:`_mla_attention`), a gated MLP
    (3 x hidden x intermediate) or, for mixture-of-experts, every routed and shared expert
    plus the router, and RMSNorm weights. Biases are ignored.

    Raises:
        SizingError: A required field is absent.
    """
    shape = model_shape(config)
    cfg, p = _text_config(config)
    h = int(shape.hidden.value)
    L = int(shape.layers.value)
    q = int(shape.attention_heads.value) * int(shape.head_dim.value)
    kv = int(shape.kv_heads.value) * int(shape.head_dim.value)
    vocab = int(_field(cfg, p, ("vocab_size",), "vocab").value)
    inter = int(_field(cfg, p, ("intermediate_size", "ffn_dim", "n_inner"), "ffn").value)
    attn = h * q + 2 * h * kv + q * h
    mla_fields: list[str] = []
    if shape.mla is not None:
        attn, mla_fields = _mla_attention(cfg, p, h, int(shape.attention_heads.value))
    experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get(
        "num_experts")
    fields = ["hidden_size", "num_hidden_layers", "num_attention_heads",
              *(mla_fields or ["num_key_value_heads", "head_dim"]), "vocab_size",
              "intermediate_size"]
    if experts:
        moe_inter = int(cfg.get("moe_intermediate_size") or inter)
        shared = int(cfg.get("n_shared_experts") or 0)
        dense_layers = int(cfg.get("first_k_dense_replace") or 0)
        moe_layer = (int(experts) + shared) * 3 * h * moe_inter + h * int(experts)
        mlp_total = dense_layers * 3 * h * inter + (L - dense_layers) * moe_layer
        fields += ["n_routed_experts|num_local_experts", "moe_intermediate_size",
                   "n_shared_experts", "first_k_dense_replace"]
    else:
        mlp_total = L * 3 * h * inter
    tied = bool(cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    total = vocab * h * (1 if tied else 2) + L * (attn + 2 * h) + mlp_total + h
    return Figure("parameters", total, "params",
                  f"estimate from config.json: {', '.join(p + f for f in fields)}"
                  + (", tie_word_embeddings" if tied else ""))
